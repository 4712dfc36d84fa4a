"""Load test of the consumer: 2,000 messages, each in the log 5 times
(10,000 deliveries), consumed by 4 processes at once through rebalances and
crashes; then the proof that every message took effect exactly once.

  loadtest.py --dsn DSN --admin-dsn DSN --workdir DIR [options]

DSN is the application's connection string (role app), ADMIN_DSN a
superuser's (to reset and read idempotency.idem_metrics). The consumers are
child processes (`loadtest.py consume ...`); one that "crashes" (exits
between its effects and its commit, with --crash-rate per batch) is started
again, as an orchestrator would. Prints its checks; exits 1 if one fails.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg2
import psycopg2.extras

from broker import SimulatedConsumer
from consumer import PointsConsumer

TOPIC = "orders"
GROUP = "loyalty"
CRASH_EXIT = 17


def produce(conn, messages, copies, partitions, seed):
    """An at-least-once producer: every message lands `copies` times, each
    copy in a random partition, the copies spread over the whole log."""
    rng = random.Random(seed)
    values = {}
    for n in range(messages):
        values[f"order-{n:05d}.paid"] = {
            "order_id": f"order-{n:05d}",
            "customer": f"customer-{rng.randrange(40):02d}",
            "points": rng.randint(1, 100),
        }
    copies_in_order = [message_id for message_id in values for _ in range(copies)]
    rng.shuffle(copies_in_order)
    next_offset = defaultdict(int)
    rows = []
    for message_id in copies_in_order:
        partition = rng.randrange(partitions)
        rows.append((TOPIC, partition, next_offset[partition], message_id, json.dumps(values[message_id])))
        next_offset[partition] += 1
    with conn, conn.cursor() as cur:
        psycopg2.extras.execute_values(
            cur, 'INSERT INTO broker.records (topic, partition, "offset", message_id, value) VALUES %s',
            rows, template="(%s, %s, %s, %s, %s::jsonb)", page_size=1000)
    return values


def lag(conn):
    """Records not yet committed by the group, over all partitions."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT coalesce(sum(e.next_offset - coalesce(o.next_offset, 0)), 0)
                 FROM (SELECT partition, max("offset") + 1 AS next_offset FROM broker.records
                        WHERE topic = %s GROUP BY partition) e
                 LEFT JOIN consumer_offsets o
                   ON o.group_id = %s AND o.topic = %s AND o.partition = e.partition""",
            (TOPIC, GROUP, TOPIC))
        return int(cur.fetchone()[0])


# ------------------------------------------------------------------ a consumer process

def consume(args):
    name = f"consumer-{args.member}"
    stats_file = Path(args.workdir) / f"stats-{args.member}-{os.getpid()}.json"
    rng = random.Random()
    fetch_conn = psycopg2.connect(args.dsn, application_name=f"{name} fetch")
    fetch_conn.autocommit = True
    conn = psycopg2.connect(args.dsn, application_name=name)

    def save_stats():
        stats_file.write_text(json.dumps({**consumer.stats, "rebalances": broker.rebalances}))

    def crash_maybe():
        # The process dies after its effects, before its commit.
        if rng.random() < args.crash_rate:
            save_stats()
            os._exit(CRASH_EXIT)

    def idle():
        if lag(fetch_conn) == 0:
            consumer.stopping = True
        else:
            time.sleep(0.02)

    consumer = PointsConsumer(conn, GROUP, name, before_commit=crash_maybe)
    broker = SimulatedConsumer(fetch_conn, TOPIC, args.member, args.consumers, consumer,
                               rebalance_every=args.rebalance_every)
    consumer.run(broker, max_records=args.batch, idle=idle)
    save_stats()


# ------------------------------------------------------------------ the test

class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'not ok'} - {name}" + (f"\n    {detail}" if not ok and detail else ""), flush=True)
        self.failed += 0 if ok else 1


def spawn(args, member):
    return subprocess.Popen([sys.executable, __file__, "consume", "--member", str(member)] + child_args(args))


def child_args(args):
    return ["--dsn", args.dsn, "--workdir", args.workdir, "--consumers", str(args.consumers),
            "--batch", str(args.batch), "--crash-rate", str(args.crash_rate),
            "--rebalance-every", str(args.rebalance_every)]


def supervise(args):
    """Runs the consumers until all of them exit 0 (the log is consumed);
    restarts the ones that crashed. Returns the number of crashes."""
    children = {member: spawn(args, member) for member in range(args.consumers)}
    crashes = 0
    deadline = time.monotonic() + args.timeout
    try:
        while children:
            for member, child in list(children.items()):
                status = child.poll()
                if status is None:
                    continue
                if status == CRASH_EXIT:
                    crashes += 1
                    children[member] = spawn(args, member)
                elif status == 0:
                    del children[member]
                else:
                    raise RuntimeError(f"consumer-{member} exited with status {status}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the consumers did not finish within {args.timeout} s")
            time.sleep(0.02)
    finally:
        for child in children.values():
            child.kill()
            child.wait()
    return crashes


def run(args):
    check = Checks()
    admin = psycopg2.connect(args.admin_dsn)
    admin.autocommit = True
    app = psycopg2.connect(args.dsn)
    app.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT idempotency.idem_metrics_reset()")

    values = produce(app, args.messages, args.copies, args.partitions, args.seed)
    print(f"produced {args.messages} messages, {args.messages * args.copies} records in "
          f"{args.partitions} partitions; consuming with {args.consumers} processes", flush=True)

    started = time.monotonic()
    crashes = supervise(args)
    elapsed = time.monotonic() - started

    totals = Counter()
    for path in Path(args.workdir).glob("stats-*.json"):
        totals.update(json.loads(path.read_text()))
    print(f"consumed in {elapsed:.1f} s: {totals['deliveries']} deliveries, {totals['duplicates']} "
          f"answered as duplicates, {totals['applied']} applied, {totals['batches']} batches, "
          f"{totals['rebalances']} rebalances seen, {crashes} crashes, {totals['retries']} retried "
          "transactions", flush=True)

    with admin.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT message_id) FROM broker.records WHERE topic = %s", (TOPIC,))
        records, distinct = cur.fetchone()
        cur.execute("SELECT count(*), count(DISTINCT message_id) FROM points_ledger")
        effects, distinct_effects = cur.fetchone()
        cur.execute("SELECT customer, sum(points) FROM points_ledger GROUP BY customer")
        points = {customer: int(total) for customer, total in cur.fetchall()}
        cur.execute("SELECT count(*) FROM idempotency.inbox WHERE source = %s", (f"{GROUP}:{TOPIC}",))
        inbox_rows = cur.fetchone()[0]
        cur.execute("SELECT inbox_duplicates FROM idempotency.idem_metrics")
        inbox_duplicates = cur.fetchone()[0]
        remaining = lag(admin)

    expected = Counter()
    for value in values.values():
        expected[value["customer"]] += value["points"]

    check(f"the log holds {records} records of {distinct} distinct messages",
          records == args.messages * args.copies and distinct == args.messages)
    check(f"at least {records} deliveries ({totals['deliveries']}: {totals['deliveries'] - records} "
          "redelivered after rebalances and crashes)", totals["deliveries"] >= records)
    check("every partition consumed to its end", remaining == 0, f"{remaining} records not committed")
    check(f"effect rows = distinct messages ({effects} = {distinct})",
          effects == distinct and distinct_effects == distinct,
          f"{effects} rows for {distinct_effects} messages")
    check("each customer's points are the sum over distinct messages",
          points == dict(expected), f"{len(points)} customers differ")
    check(f"applied in committed transactions = distinct messages ({totals['applied']})",
          totals["applied"] == distinct)
    check(f"one inbox row per message ({inbox_rows})", inbox_rows == distinct)
    check(f"idem_metrics.inbox_duplicates = duplicates delivered ({inbox_duplicates} = {totals['duplicates']})",
          inbox_duplicates == totals["duplicates"])
    check(f"duplicates answered: at least {records - distinct} ({totals['duplicates']})",
          totals["duplicates"] >= records - distinct)
    check(f"consumers were restarted after crashes ({crashes}) and saw rebalances ({totals['rebalances']})",
          args.crash_rate == 0 or (crashes > 0 and totals["rebalances"] > args.consumers))
    return check.failed == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=["run", "consume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--admin-dsn")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--member", type=int)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--crash-rate", type=float, default=0.05)
    parser.add_argument("--rebalance-every", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.command == "consume":
        consume(args)
        return 0
    if not args.admin_dsn:
        parser.error("--admin-dsn is required")
    # On SIGTERM, unwind (supervise() stops the consumers) and exit.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
