#!/usr/bin/python3
"""idem-relay benchmark driver (see bench.sh): end-to-end throughput to stdout
and to the local HTTP receiver, and the delay from the enqueuing transaction's
commit to delivery at a steady load. Needs psycopg2 (python3-psycopg2)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

try:
    import psycopg2
except ImportError:
    sys.exit("bench.py needs psycopg2 (apt-get install python3-psycopg2)")


def connect(dsn):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def sql(conn, query, args=None):
    with conn.cursor() as cur:
        cur.execute(query, args)
        return cur.fetchall() if cur.description else None


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, int(round(p / 100.0 * (len(ordered) - 1)))))
    return ordered[k]


def throughput(a, conn, name, sink, topic, events, keys, extra):
    """Bulk-enqueues `events` events, then times one --once run that delivers them."""
    key = "NULL" if keys == 0 else "'k' || (g %%%% %d)" % keys
    sql(conn, "SELECT count(idempotency.outbox_enqueue(%%s, jsonb_build_object('seq', g, 'pad', repeat('x', 100)), %s))"
        " FROM generate_series(1, %%s) g" % key, (topic, events))
    args = [a.relay, "--dsn", a.relay_dsn, "--relay", "bench-" + name, "--sink", sink,
            "--topics", topic, "--once", "--progress-interval", "0"] + extra
    start = time.time()
    with open(os.devnull, "w") as devnull:
        rc = subprocess.run(args, stdout=devnull, stderr=subprocess.PIPE, timeout=600).returncode
    seconds = time.time() - start
    delivered = sql(conn, "SELECT count(*) FROM idempotency.outbox WHERE topic = %s AND state = 'delivered'",
                    (topic,))[0][0]
    rate = delivered / seconds if seconds > 0 else 0
    print("  %-44s %7d events in %6.2f s = %8.0f events/s%s"
          % (name, delivered, seconds, rate, "" if rc == 0 and delivered == events else
             "  (exit %d, %d of %d delivered)" % (rc, delivered, events)), flush=True)
    return rate


def latency(a, conn, name, sink, topic, receiver_log, extra):
    """A steady load of one event per transaction; the delay from each commit's
    return to the event's arrival at the sink."""
    arrivals = {}
    args = [a.relay, "--dsn", a.relay_dsn, "--relay", "bench-" + name, "--sink", sink,
            "--topics", topic, "--progress-interval", "0"] + extra
    relay = subprocess.Popen(args, stdout=subprocess.PIPE if sink == "stdout" else subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)

    def read_stdout():
        for line in relay.stdout:
            now = time.time()
            try:
                arrivals[json.loads(line)["payload"]["seq"]] = now
            except (ValueError, KeyError, TypeError):
                pass

    reader = None
    if sink == "stdout":
        reader = threading.Thread(target=read_stdout, daemon=True)
        reader.start()
    time.sleep(1.0)  # the relay is up and idle

    producer = psycopg2.connect(a.dsn)
    commits = {}
    count = int(a.rate * a.seconds)
    start = time.time()
    with producer.cursor() as cur:
        for seq in range(1, count + 1):
            due = start + (seq - 1) / a.rate
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            cur.execute("SELECT idempotency.outbox_enqueue(%s, jsonb_build_object('seq', %s), %s)",
                        (topic, seq, "k%d" % (seq % 50)))
            producer.commit()
            commits[seq] = time.time()
    producer.close()

    deadline = time.time() + 30
    while time.time() < deadline:
        if sink != "stdout":
            arrivals.clear()
            with open(receiver_log) as f:
                for line in f:
                    e = json.loads(line)
                    if e.get("topic") == topic and e.get("seq") is not None:
                        arrivals.setdefault(e["seq"], e["t"])
        if len(arrivals) >= count:
            break
        time.sleep(0.2)
    relay.terminate()
    try:
        relay.wait(timeout=30)
    except subprocess.TimeoutExpired:
        relay.kill()
    delays = [(arrivals[s] - commits[s]) * 1000 for s in commits if s in arrivals]
    print("  %-44s %5d events at %4.0f/s: commit-to-delivery median %6.2f ms, p99 %6.2f ms, max %6.2f ms%s"
          % (name, len(delays), a.rate, statistics.median(delays) if delays else float("nan"),
             percentile(delays, 99), max(delays) if delays else float("nan"),
             "" if len(delays) == count else "  (%d of %d arrived)" % (len(delays), count)), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True, help="superuser DSN for the load")
    p.add_argument("--relay-dsn", required=True)
    p.add_argument("--relay", required=True, help="the idem-relay binary")
    p.add_argument("--http", required=True, help="receiver URL")
    p.add_argument("--receiver-log", required=True)
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--http-events", type=int, default=5000)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()
    conn = connect(a.dsn)

    print("throughput (bulk-enqueued backlog, one --once run, durable commits):", flush=True)
    throughput(a, conn, "stdout, no key, --batch 100", "stdout", "tp_stdout_100", a.events, 0, [])
    throughput(a, conn, "stdout, no key, --batch 1000", "stdout", "tp_stdout_1000", a.events, 0,
               ["--batch", "1000"])
    throughput(a, conn, "stdout, 1000 keys, --batch 1000", "stdout", "tp_stdout_keys", a.events, 1000,
               ["--batch", "1000"])
    throughput(a, conn, "http, no key, --parallel 1", a.http, "tp_http_1", a.http_events, 0, [])
    throughput(a, conn, "http, no key, --parallel 4", a.http, "tp_http_4", a.http_events, 0,
               ["--parallel", "4"])
    throughput(a, conn, "http, 1000 keys, --parallel 4", a.http, "tp_http_keys", a.http_events, 1000,
               ["--parallel", "4"])
    print("latency (steady load, one event per transaction, 50 keys; from the commit's return):",
          flush=True)
    latency(a, conn, "stdout", "stdout", "lat_stdout", a.receiver_log, [])
    latency(a, conn, "http, --parallel 4", a.http, "lat_http", a.receiver_log, ["--parallel", "4"])


if __name__ == "__main__":
    main()
