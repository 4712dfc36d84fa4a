#!/usr/bin/python3
"""idem-relay benchmark driver (see bench.sh). Needs psycopg2.

Throughput: every run starts from the same backlog (bench.outbox_prefill:
EVENTS events of topic 'orders', without a key, over 1000 keys, of distinct
keys or of one key), in
idempotency.outbox for
idem-relay and in bench.outbox (the same columns and indexes) for the
hand-written loops (test/bench/hand_loop.cpp, with or without per-key
order), after a VACUUM and a
CHECKPOINT; a run is timed from the start of its processes to their exit
(--once), and the events delivered are counted in the table. The variants
run ROUNDS times in rotating order; the median is reported, with its ratio
to the hand loop's median. Beside the wall time: the CPU seconds of the
relay processes, of PostgreSQL (all of the cluster's processes) and of the
broker, which share the machine's cores.

Latency: a steady RATE events/s for SECONDS s, one event per transaction
from a few producer connections, to a running relay; the delay from each
commit's return to the event's arrival at the sink's consumer."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

try:
    import psycopg2
except ImportError:
    sys.exit("bench.py needs psycopg2 (apt-get install python3-psycopg2)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import brokers  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_seconds(pids):
    """utime + stime of the processes (those still there)."""
    total = 0
    for pid in pids:
        try:
            fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / TICKS


def children_of(postmaster):
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(open("/proc/%s/stat" % entry).read().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return children


def cluster_cpu(postmaster, children):
    """CPU seconds of the whole cluster so far: the postmaster's own, its
    children that ended and were reaped (cutime + cstime) and CHILDREN, the
    running ones."""
    total = 0
    try:
        fields = open("/proc/%d/stat" % postmaster).read().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15])
    except (OSError, IndexError, ValueError):
        pass
    return total / TICKS + cpu_seconds(children)


class Bench:
    def __init__(self, a):
        self.a = a
        self.conn = connect(a.dsn)
        self.postmaster = int(open(a.postmaster_pid).readline())
        self.broker_pids = {"nats": a.nats_pid, "amqp": a.amqp_pid}

    def reset(self, target, keys):
        """The same backlog again, in the same state for every run: both
        tables emptied (TRUNCATE: the earlier runs leave no bloat in the
        indexes), EVENTS events over `keys` keys (0: no key) enqueued,
        a checkpoint."""
        sql(self.conn, "TRUNCATE idempotency.outbox, bench.outbox")
        sql(self.conn, "SELECT bench.outbox_prefill(%s, %s, %s)", (self.a.events, target, keys))
        sql(self.conn, "VACUUM ANALYZE %s" % ("bench.outbox" if target == "plain" else "idempotency.outbox"))
        sql(self.conn, "CHECKPOINT")
        if self.a.nats_port:
            brokers.js(self.a.nats_port, "STREAM.PURGE.BENCH")
        if self.a.amqp_port:
            brokers.amqp_purge(self.a.amqp_port, "orders")

    def delivered(self, target):
        table = "bench.outbox" if target == "plain" else "idempotency.outbox"
        return sql(self.conn, "SELECT count(*) FROM %s WHERE state = 'delivered'" % table)[0][0]

    def run(self, variant, keys):
        """One timed run; (events/s, CPU seconds of relay, PostgreSQL, broker)."""
        target = "plain" if variant["hand"] else "extension"
        self.reset(target, keys)
        procs = []
        broker_pid = self.broker_pids.get(variant.get("broker"))
        running = children_of(self.postmaster)
        pg_before = cluster_cpu(self.postmaster, running)
        broker_before = cpu_seconds([broker_pid]) if broker_pid else 0
        start = time.time()
        with open(os.devnull, "w") as devnull:
            for n in range(variant["processes"]):
                if variant.get("pgbench"):
                    args = [self.a.pgbench, "-n", "-c", "1", "-f", self.a.sql_loop,
                            "-t", str(self.a.events // self.a.batch + 10), self.a.relay_dsn]
                elif variant["hand"]:
                    args = [self.a.hand_loop, self.a.relay_dsn, str(self.a.batch)]
                    if variant.get("ordered"):
                        args.append("ordered")
                else:
                    args = [self.a.relay, "--dsn", self.a.relay_dsn, "--relay", "bench-%d" % n,
                            "--sink", variant["sink"], "--topics", "orders", "--once",
                            "--batch", str(self.a.batch), "--progress-interval", "0"] + variant["extra"]
                # Its log to a file: a pipe read only after the exit would
                # stop a relay that logs much (retries) at a full buffer.
                log = tempfile.TemporaryFile()
                procs.append((subprocess.Popen(args, stdout=devnull, stderr=log), log))
            usage = 0.0
            failures = []
            for p, log in procs:
                _, status, rusage = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                usage += rusage.ru_utime + rusage.ru_stime
                if p.returncode != 0:
                    log.seek(0)
                    failures.append("exit %d: %s" % (p.returncode, log.read().decode()[-300:]))
                log.close()
        seconds = time.time() - start
        # The processes the run started (its backends) have ended and been
        # reaped: their time is in the postmaster's children time.
        deadline = time.time() + 10
        while time.time() < deadline and set(children_of(self.postmaster)) - set(running):
            time.sleep(0.01)
        pg_cpu = cluster_cpu(self.postmaster, [p for p in running if os.path.exists("/proc/%d" % p)]) - pg_before
        broker_cpu = cpu_seconds([broker_pid]) - broker_before if broker_pid else 0
        delivered = self.delivered(target)
        if delivered != self.a.events or failures:
            print("    (%s: %d of %d delivered; %s)" % (variant["name"], delivered, self.a.events,
                                                      "; ".join(failures)), flush=True)
        return delivered / seconds, usage, pg_cpu, broker_cpu, seconds

    def throughput(self, variants, keys):
        results = {v["name"]: [] for v in variants}
        for r in range(self.a.rounds):
            # Rotating order: no variant always runs first (or last).
            for i in range(len(variants)):
                v = variants[(i + r) % len(variants)]
                results[v["name"]].append(self.run(v, v.get("keys", keys)))
        return results


def report(title, variants, results, baseline):
    print(title, flush=True)
    base = statistics.median([r[0] for r in results[baseline]])
    print("  %-46s %10s %7s %9s %9s %9s %8s" % ("", "events/s", "ratio", "wall s", "relay cpu",
                                              "pg cpu", "broker"))
    for v in variants:
        runs = results[v["name"]]
        rates = [r[0] for r in runs]
        median_run = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        print("  %-46s %10.0f %6.2fx %9.2f %9.2f %9.2f %8s%s" % (
            v["name"], statistics.median(rates), statistics.median(rates) / base, median_run[4],
            median_run[1], median_run[2], "%.2f" % median_run[3] if v.get("broker") else "-",
            "" if len(rates) == 1 else "   (runs: %s)" % ", ".join("%.0f" % x for x in rates)),
            flush=True)


# ------------------------------------------------------------------ latency
class Arrivals:
    """seq -> arrival time, filled by a consumer thread."""

    def __init__(self):
        self.times = {}
        self.stop = threading.Event()

    def note(self, body):
        try:
            seq = json.loads(body)["seq"]
        except (ValueError, KeyError, TypeError):
            return
        self.times.setdefault(seq, time.time())


def consume_stdout(relay, arrivals):
    for line in relay.stdout:
        try:
            arrivals.note(json.dumps(json.loads(line)["payload"]))
        except (ValueError, KeyError):
            pass


def consume_nats(port, subject, arrivals, ready):
    nats = brokers.Nats(port, timeout=1.0)
    nats.subscribe(subject)
    nats.sock.sendall(b"PING\r\n")
    ready.set()
    while not arrivals.stop.is_set():
        try:
            _, _, data = nats.next_message()
        except OSError:
            continue
        arrivals.note(data)
    nats.sock.close()


def consume_amqp(port, queue, arrivals, ready):
    connection, channel = brokers.amqp_channel(port)
    ready.set()
    for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=0.2):
        if arrivals.stop.is_set():
            break
        if method is not None:
            arrivals.note(body)
    channel.cancel()
    connection.close()


def latency(a, name, sink, topic, extra, consumer=None):
    arrivals = Arrivals()
    args = [a.relay, "--dsn", a.relay_dsn, "--relay", "lat-" + topic, "--sink", sink,
            "--topics", topic, "--progress-interval", "0"] + extra
    relay = subprocess.Popen(args, stdout=subprocess.PIPE if sink == "stdout" else subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True)
    threads = []
    ready = threading.Event()
    if sink == "stdout":
        threads.append(threading.Thread(target=consume_stdout, args=(relay, arrivals), daemon=True))
        ready.set()
    elif consumer is not None:
        threads.append(threading.Thread(target=consumer, args=(arrivals, ready), daemon=True))
    for t in threads:
        t.start()
    ready.wait(10)
    time.sleep(1.0)  # the relay is connected and idle

    count = int(a.rate * a.seconds)
    commits = {}
    producers = max(1, a.producers)
    lock = threading.Lock()
    start = time.time() + 0.2

    def produce(first):
        conn = psycopg2.connect(a.dsn)
        with conn.cursor() as cur:
            for seq in range(first, count + 1, producers):
                due = start + (seq - 1) / a.rate
                pause = due - time.time()
                if pause > 0:
                    time.sleep(pause)
                cur.execute("SELECT idempotency.outbox_enqueue(%s, jsonb_build_object('seq', %s), %s)",
                            (topic, seq, "k%d" % (seq % 50)))
                conn.commit()
                with lock:
                    commits[seq] = time.time()
        conn.close()

    workers = [threading.Thread(target=produce, args=(i + 1,)) for i in range(producers)]
    for w in workers:
        w.start()
    # The machine's load while the events flow: the delays hold for it.
    loads = []
    while any(w.is_alive() for w in workers):
        loads.append(os.getloadavg()[0])
        for w in workers:
            w.join(0.5)
    achieved = count / (max(commits.values()) - start) if commits else 0
    deadline = time.time() + 30
    while time.time() < deadline and len(arrivals.times) < count:
        time.sleep(0.1)
    arrivals.stop.set()
    relay.terminate()
    try:
        relay.wait(timeout=30)
    except subprocess.TimeoutExpired:
        relay.kill()
    for t in threads:
        t.join(5)
    delays = [(arrivals.times[s] - commits[s]) * 1000 for s in commits if s in arrivals.times]
    print("  %-34s %6d events at %5.0f/s: median %7.2f ms, p99 %7.2f ms, max %7.2f ms, "
          "load average %.2f on %d cores%s"
          % (name, len(delays), achieved, statistics.median(delays) if delays else float("nan"),
             percentile(delays, 99), max(delays) if delays else float("nan"),
             statistics.median(loads) if loads else os.getloadavg()[0], os.cpu_count() or 1,
             "" if len(delays) == count else "  (%d of %d arrived)" % (len(delays), count)), flush=True)


# The sections, in the order they run (--sections picks some).
SECTIONS = ["unkeyed", "keyed", "distinct", "hot", "scaling", "http", "latency"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True, help="superuser DSN for the load")
    p.add_argument("--relay-dsn", required=True)
    p.add_argument("--relay", required=True, help="the idem-relay binary")
    p.add_argument("--hand-loop", required=True, help="the hand-written loop's binary")
    p.add_argument("--pgbench", required=True, help="pgbench, for the SQL loop")
    p.add_argument("--sql-loop", required=True, help="pgbench script: one claim + ack transaction")
    p.add_argument("--postmaster-pid", required=True, help="the cluster's postmaster.pid")
    p.add_argument("--http", help="receiver URL")
    p.add_argument("--receiver-log")
    p.add_argument("--nats-port", type=int)
    p.add_argument("--nats-pid", type=int)
    p.add_argument("--amqp-port", type=int)
    p.add_argument("--amqp-pid", type=int)
    p.add_argument("--events", type=int, default=100000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--sections", default=" ".join(SECTIONS),
                   help="which to run, of: " + " ".join(SECTIONS))
    a = p.parse_args()
    chosen = a.sections.split()
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        p.error("unknown section(s): %s (known: %s)" % (" ".join(unknown), " ".join(SECTIONS)))
    bench = Bench(a)
    nats_sink = "nats://127.0.0.1:%d/bench" % a.nats_port if a.nats_port else None
    amqp_sink = "amqp://guest:guest@127.0.0.1:%d/" % a.amqp_port if a.amqp_port else None

    def relay(name, sink, extra=(), processes=1, broker=None):
        return {"name": name, "hand": False, "sink": sink, "extra": list(extra),
                "processes": processes, "broker": broker}

    def hand(name, processes=1, ordered=False):
        return {"name": name, "hand": True, "processes": processes, "ordered": ordered}

    # The extension's claim and ack alone: what the relay builds on.
    sql_loop = {"name": "outbox_claim + outbox_ack in SQL (pgbench)", "hand": False,
                "pgbench": True, "processes": 1}

    def sinks(prefix, extra=(), processes=1):
        found = [relay(prefix + "stdout", "stdout", extra, processes)]
        if nats_sink:
            found.append(relay(prefix + "NATS JetStream", nats_sink, extra, processes, "nats"))
        if amqp_sink:
            found.append(relay(prefix + "RabbitMQ", amqp_sink, extra, processes, "amqp"))
        return found

    lanes = ["--connections", "2"]
    if "unkeyed" in chosen:
        # Events without a key: no order to keep, the same work for the hand
        # loop and the relay.
        unkeyed = ([hand("hand-written SKIP LOCKED loop, stdout"), sql_loop] + sinks("idem-relay, ") +
                   sinks("idem-relay --connections 2, ", lanes))
        results = bench.throughput(unkeyed, 0)
        report("throughput: a backlog of %d events without a key, --batch %d, one process, median of %d"
               % (a.events, a.batch, a.rounds), unkeyed, results, unkeyed[0]["name"])

    if "keyed" in chosen:
        # Events over 1000 keys: the relay hands a key's next event out only
        # after its previous one is acked; so does the ordered hand loop, the
        # baseline here. The unordered loop shows what the order costs.
        keyed = [hand("hand loop keeping per-key order, stdout", ordered=True),
                 hand("hand loop without order, stdout"), sql_loop] + sinks("idem-relay, ") + \
            [relay("idem-relay --run-length 1, stdout", "stdout", ["--run-length", "1"])] + \
            sinks("idem-relay --connections 2, ", lanes)
        results = bench.throughput(keyed, 1000)
        report("throughput: a backlog of %d events over 1000 keys, --batch %d, one process, median of %d;"
               " ratios to the hand loop that keeps per-key order" % (a.events, a.batch, a.rounds),
               keyed, results, keyed[0]["name"])

    if "distinct" in chosen:
        # Events of distinct keys: each key has nothing queued behind its
        # event, so runs do not help; what the order costs the relay beyond a
        # keyless event (a look at the key at enqueue and at ack).
        distinct = [hand("hand loop keeping per-key order, stdout", ordered=True),
                    hand("hand loop without order, stdout"), relay("idem-relay, stdout", "stdout")]
        results = bench.throughput(distinct, -1)
        report("throughput: a backlog of %d events of distinct keys, --batch %d, one process, median of %d;"
               " ratios to the hand loop that keeps per-key order" % (a.events, a.batch, a.rounds),
               distinct, results, distinct[0]["name"])

    if "hot" in chosen:
        # One hot key: its whole backlog behind one head. Runs (--run-length,
        # 100 by default) drain it a batch at a time; the baseline is the same
        # relay on a backlog without a key.
        hot = [dict(relay("idem-relay, stdout, no key", "stdout"), keys=0),
               dict(relay("idem-relay, stdout, one key", "stdout"), keys=1)]
        results = bench.throughput(hot, 1)
        report("hot key: a backlog of %d events of one key against the same backlog without a key,"
               " --batch %d, one process, median of %d" % (a.events, a.batch, a.rounds),
               hot, results, hot[0]["name"])

    if "scaling" in chosen:
        scale_variants = [hand("hand loop, 1 process"), hand("hand loop, 2 processes", 2),
                          hand("hand loop, 4 processes", 4)]
        scale_variants += sinks("idem-relay --parallel 4, ", ["--parallel", "4"])
        scale_variants += sinks("2 idem-relays, ", processes=2)
        scale_variants.append(relay("4 idem-relays, stdout", "stdout", processes=4))
        results = bench.throughput(scale_variants, 0)
        report("scaling: the backlog without a key, ratios to one hand loop", scale_variants, results,
               scale_variants[0]["name"])

    if "http" in chosen:
        if a.http:
            http_variants = [hand("hand loop, stdout"),
                             relay("idem-relay, HTTP (Python receiver), --parallel 4", a.http,
                                   ["--parallel", "4"])]
            results = bench.throughput(http_variants, 0)
            report("HTTP: the same backlog to the local receiver (a single Python process bounds it)",
                   http_variants, results, http_variants[0]["name"])

    if "latency" in chosen:
        print("latency: %.0f events/s for %.0f s, one event per transaction from %d producers, 50 keys;"
              " from the commit's return to arrival at the consumer:" % (a.rate, a.seconds, a.producers),
              flush=True)
        latency(a, "stdout", "stdout", "lat_stdout", [])
        if nats_sink:
            latency(a, "NATS JetStream (subscriber)", nats_sink, "lat_nats", [],
                    lambda arr, ready: consume_nats(a.nats_port, "bench.lat_nats", arr, ready))
        if amqp_sink:
            latency(a, "RabbitMQ (consumer)", amqp_sink, "lat_amqp", [],
                    lambda arr, ready: consume_amqp(a.amqp_port, "lat_amqp", arr, ready))

if __name__ == "__main__":
    main()
