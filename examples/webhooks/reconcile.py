"""Reconciliation: what the shop committed against what the partner applied.

  reconcile.py --dsn DSN --partner http://127.0.0.1:PORT [--wait SECONDS]
               [--redrive] [--json FILE]

The shop's side is its business tables (order_events: every webhook it
committed, with the outbox id; orders: each order's status) and, for each
event, its state in the outbox (delivered, dead, pending, in_flight; gone once
delivered events are purged after idempotency.outbox_retention). The
partner's side is what it applied (GET /events) and its copy of each order
(GET /orders). Events are matched on the business event id, which is also the
dedup_key and the Idempotency-Key.

It reports
  - events the partner applied once (the goal: every committed event);
  - events the partner applied more than once (must never happen);
  - events the partner never applied: dead letters (listed, with the
    redrive to run once the cause is fixed), events not delivered yet, and
    events the outbox says were delivered but the partner has no record of
    (lost: the partner acknowledged what it did not keep);
  - events the partner applied that the shop never committed (a rolled-back
    transaction's event, or someone else's);
  - orders whose events the partner applied out of order;
  - orders whose status differs between the shop and the partner.

--wait S waits up to S seconds for events in flight or retrying to settle
first. --redrive returns the topic's dead letters to the outbox
(outbox_redrive, an administrator's function) after the partner's fix, waits
for them (--wait) and reconciles again.

Exit status: 0 in sync (every committed event applied exactly once, nothing
else applied, order and state agree); 1 on a mismatch; 2 when the only
differences are events still outstanding (dead letters, undelivered).
The DSN's role reads the outbox table and calls outbox_redrive: the
extension's owner (here the superuser).
"""
import argparse
import json
import sys
import time
import urllib.request
from collections import Counter, defaultdict

import psycopg2

from app import TOPIC

IN_SYNC, MISMATCH, OUTSTANDING = 0, 1, 2


def shop_side(conn, topic):
    with conn, conn.cursor() as cur:
        cur.execute("""SELECT e.event_id, e.order_id, e.type, e.seq, e.outbox_id,
                              o.state::text, o.attempts, o.last_error
                         FROM order_events e LEFT JOIN idempotency.outbox o ON o.id = e.outbox_id
                        ORDER BY e.order_id, e.seq""")
        events = [dict(zip(("event_id", "order_id", "type", "seq", "outbox_id", "state", "attempts", "last_error"),
                           row)) for row in cur.fetchall()]
        cur.execute("SELECT id, status FROM orders")
        orders = dict(cur.fetchall())
        # Outbox events of the topic without a business event: must not exist,
        # since both are written in one transaction.
        cur.execute("""SELECT o.id, o.dedup_key FROM idempotency.outbox o
                        WHERE o.topic = %s
                          AND NOT EXISTS (SELECT 1 FROM order_events e WHERE e.outbox_id = o.id)""", (topic,))
        orphans = cur.fetchall()
        cur.execute("""SELECT id, key, dedup_key, attempts, last_error, died_at
                         FROM idempotency.outbox_dead_letters WHERE topic = %s ORDER BY id""", (topic,))
        dead = [dict(zip(("id", "key", "dedup_key", "attempts", "last_error", "died_at"), row))
                for row in cur.fetchall()]
    return events, orders, orphans, dead


def partner_side(url):
    def get(path):
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=10) as response:
            return json.load(response)
    return get("/events")["events"], {o["order_id"]: o for o in get("/orders")["orders"]}


def wait_settled(conn, seconds):
    """Waits until no committed event is pending or in flight; False on timeout."""
    deadline = time.monotonic() + seconds
    while True:
        with conn, conn.cursor() as cur:
            cur.execute("""SELECT count(*) FROM order_events e JOIN idempotency.outbox o ON o.id = e.outbox_id
                            WHERE o.state IN ('pending', 'in_flight')""")
            left = cur.fetchone()[0]
        if left == 0:
            return True
        if time.monotonic() > deadline:
            print(f"reconcile: {left} event(s) still undelivered after {seconds:g} s", flush=True)
            return False
        time.sleep(0.2)


def reconcile(conn, partner_url, topic):
    events, orders, orphans, dead = shop_side(conn, topic)
    applied, partner_orders = partner_side(partner_url)

    by_event = defaultdict(list)
    for row in applied:
        by_event[row["event_id"]].append(row)
    committed = {e["event_id"]: e for e in events}

    report = {"committed": len(events), "applied": len(applied), "applied_once": [], "applied_twice": [],
              "dead": [], "undelivered": [], "lost": [], "unknown_at_shop": [], "out_of_order": [],
              "state_differs": [], "orphans": [list(o) for o in orphans], "dead_letters": [],
              "wrong_key": []}
    for e in events:
        rows = by_event.get(e["event_id"], [])
        if len(rows) == 1:
            report["applied_once"].append(e["event_id"])
        elif len(rows) > 1:
            report["applied_twice"].append({"event_id": e["event_id"], "times": len(rows)})
        elif e["state"] == "dead":
            report["dead"].append(e["event_id"])
        elif e["state"] in ("pending", "in_flight"):
            report["undelivered"].append({"event_id": e["event_id"], "state": e["state"],
                                          "attempts": e["attempts"], "last_error": e["last_error"]})
        else:        # delivered, or delivered and since purged from the outbox
            report["lost"].append({"event_id": e["event_id"], "state": e["state"] or "purged (delivered)"})
        for row in rows:
            if row["idempotency_key"] != e["event_id"]:
                report["wrong_key"].append({"event_id": e["event_id"], "idempotency_key": row["idempotency_key"]})
    report["unknown_at_shop"] = [row["event_id"] for row in applied if row["event_id"] not in committed]

    # Order: by first application, each order's events must come in seq order.
    first = {}
    for row in applied:
        first.setdefault(row["event_id"], row)
    per_order = defaultdict(list)
    for event_id, row in first.items():
        if event_id in committed:
            per_order[row["order_id"]].append((row["position"], row["seq"], row["type"]))
    for order, rows in sorted(per_order.items()):
        seqs = [seq for _, seq, _ in sorted(rows)]
        if seqs != sorted(seqs):
            report["out_of_order"].append({"order_id": order, "applied": [t for _, _, t in sorted(rows)]})

    outstanding_orders = {committed[i]["order_id"] for i in report["dead"]} | \
        {committed[u["event_id"]]["order_id"] for u in report["undelivered"]}
    for order, status in sorted(orders.items()):
        theirs = partner_orders.get(order, {}).get("status")
        if theirs != status:
            report["state_differs"].append({"order_id": order, "shop": status, "partner": theirs,
                                            "explained": order in outstanding_orders})

    for d in dead:
        report["dead_letters"].append({"id": d["id"], "key": d["key"], "event_id": d["dedup_key"],
                                       "attempts": d["attempts"], "last_error": d["last_error"],
                                       "died_at": d["died_at"].isoformat()})

    mismatch = (report["applied_twice"] or report["lost"] or report["unknown_at_shop"] or report["out_of_order"]
                or report["orphans"] or report["wrong_key"]
                or any(not s["explained"] for s in report["state_differs"]))
    outstanding = report["dead"] or report["undelivered"] or report["dead_letters"]
    report["result"] = "mismatch" if mismatch else "outstanding" if outstanding else "in sync"
    report["exit"] = MISMATCH if mismatch else OUTSTANDING if outstanding else IN_SYNC
    return report


def show(report, topic):
    n = len
    print(f"reconcile: topic {topic}: the shop committed {report['committed']} event(s), "
          f"the partner applied {report['applied']}")
    print(f"  applied exactly once          {n(report['applied_once'])}")
    print(f"  applied more than once        {n(report['applied_twice'])}" +
          "".join(f"\n      {a['event_id']} ({a['times']} times)" for a in report["applied_twice"]))
    print(f"  never applied: dead letters   {n(report['dead'])}")
    print(f"  never applied: not delivered  {n(report['undelivered'])}" +
          "".join(f"\n      {u['event_id']} ({u['state']}, {u['attempts']} attempt(s), last error: {u['last_error']})"
                  for u in report["undelivered"]))
    print(f"  never applied: lost           {n(report['lost'])}  (the outbox says delivered)" +
          "".join(f"\n      {lost['event_id']} ({lost['state']})" for lost in report["lost"]))
    print(f"  applied, never committed      {n(report['unknown_at_shop'])}" +
          "".join(f"\n      {e}" for e in report["unknown_at_shop"]))
    print(f"  orders applied out of order   {n(report['out_of_order'])}" +
          "".join(f"\n      {o['order_id']}: {' -> '.join(o['applied'])}" for o in report["out_of_order"]))
    print(f"  orders whose status differs   {n(report['state_differs'])}" +
          "".join(f"\n      {s['order_id']}: shop {s['shop']}, partner {s['partner']}"
                  + (" (its event is outstanding)" if s["explained"] else "") for s in report["state_differs"]))
    if report["orphans"] or report["wrong_key"]:
        print(f"  outbox events without a business event: {report['orphans']}; "
              f"applied under another key: {report['wrong_key']}")
    if report["dead_letters"]:
        print("dead letters (idempotency.outbox_dead_letters):")
        for d in report["dead_letters"]:
            print(f"  outbox id {d['id']}  {d['event_id']}  key {d['key']}  {d['attempts']} attempt(s)  "
                  f"died {d['died_at']}\n      last error: {d['last_error']}")
        ids = ",".join(str(d["id"]) for d in report["dead_letters"])
        print(f"  once the cause is fixed: SELECT idempotency.outbox_redrive(ARRAY[{ids}]::bigint[]);"
              f"  (or reconcile.py --redrive)")
    print(f"result: {report['result']} (exit {report['exit']})", flush=True)


def redrive(conn, topic, dead_letters):
    ids = [d["id"] for d in dead_letters]
    with conn, conn.cursor() as cur:
        cur.execute("SELECT idempotency.outbox_redrive(%s::bigint[])", (ids,))
        count = cur.fetchone()[0]
    print(f"reconcile: redrove {count} dead letter(s) of {topic}: outbox ids {ids}", flush=True)
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True, help="the shop's database, as the extension's owner")
    parser.add_argument("--partner", required=True, help="the partner's base URL, http://127.0.0.1:PORT")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--wait", type=float, default=0, help="seconds to wait for events to settle first")
    parser.add_argument("--redrive", action="store_true", help="redrive the dead letters, then reconcile again")
    parser.add_argument("--json", help="also write the (last) report to this file")
    args = parser.parse_args()

    conn = psycopg2.connect(args.dsn, application_name="reconcile")
    if args.wait:
        wait_settled(conn, args.wait)
    report = reconcile(conn, args.partner, args.topic)
    show(report, args.topic)
    if args.redrive and report["dead_letters"]:
        redrive(conn, args.topic, report["dead_letters"])
        if args.wait:
            wait_settled(conn, args.wait)
        report = reconcile(conn, args.partner, args.topic)
        show(report, args.topic)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return report["exit"]


if __name__ == "__main__":
    sys.exit(main())
