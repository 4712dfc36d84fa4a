"""For whoever is on call: the invoice e-mail jobs in the dead letters, with
the state of their idempotency keys, and the keys that are stuck.

  deadletters.py [--dsn DSN] [--json]

Run it as a role that may read the extension's views (a member of
pg_monitor). A dead job is not retried by itself: fix the cause, then
`SELECT idempotency.outbox_redrive(ARRAY[id])` as an administrator returns
it to the queue. Its key is FAILED_FINAL, so the worker acks the redriven
job as a duplicate of a failed one: to run the work again, enqueue it under
a new idempotency key.
"""
import argparse
import json
import sys

import psycopg

from worker import SCOPE, TOPIC

DEAD = """
SELECT d.id, d.payload->>'idempotency_key' AS key, d.attempts AS deliveries, d.last_error,
       d.died_at::text, k.status::text AS key_status, k.attempts AS key_attempts
  FROM idempotency.outbox_dead_letters d
  LEFT JOIN LATERAL idempotency.idem_get(d.payload->>'idempotency_key', %s) k ON true
 WHERE d.topic = %s
 ORDER BY d.id"""

STUCK = """
SELECT key, status::text, attempts, stuck_for::text
  FROM idempotency.idem_stuck
 WHERE scope = %s
 ORDER BY stuck_for DESC"""


def report(conn):
    with conn.cursor() as cur:
        cur.execute(DEAD, (SCOPE, TOPIC))
        columns = [c.name for c in cur.description]
        dead = [dict(zip(columns, row)) for row in cur.fetchall()]
        cur.execute(STUCK, (SCOPE,))
        columns = [c.name for c in cur.description]
        stuck = [dict(zip(columns, row)) for row in cur.fetchall()]
    return {"dead_letters": dead, "stuck": stuck}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="", help="libpq connection string (default: the PG* environment)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with psycopg.connect(args.dsn, application_name="deadletters") as conn:
        found = report(conn)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(f"{len(found['dead_letters'])} dead letter(s) in {TOPIC}")
    for d in found["dead_letters"]:
        print(f"  job {d['id']}  {d['key']}  key {d['key_status']} after {d['key_attempts']} attempt(s), "
              f"{d['deliveries']} deliveries, died {d['died_at']}\n    {d['last_error']}")
    print(f"{len(found['stuck'])} stuck key(s) in {SCOPE}")
    for s in found["stuck"]:
        print(f"  {s['key']}  {s['status']}  {s['attempts']} attempt(s), stuck for {s['stuck_for']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
