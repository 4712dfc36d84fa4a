"""The shop: business transactions that enqueue their webhooks in the
transactional outbox. Each webhook is enqueued in the transaction that makes
the business change, so it exists if and only if that transaction commits.

  app.py --dsn DSN --orders 40 --threads 4 --log FILE [--seed N]

Every order lives through order.created, order.paid, order.shipped and, for
a few, order.refunded: one topic (the partner's subscription), keyed by the
order, so the partner receives one order's events in the order they were
committed. The dedup_key (and so the Idempotency-Key the partner sees) is
the business event id, derived from the business object (the order, the
payment, the shipment, the refund).

On purpose, some transactions roll back after they enqueued their webhook
(an order out of stock, a declined card, a cancelled refund): those events
must never reach the partner. Some shipments are reported twice by the
warehouse: the second enqueue, with the same dedup_key, returns the first
event's id and adds nothing.

One refund uses a reason the partner's API does not know yet
("chargeback"): the partner answers 400 and the event ends in
outbox_dead_letters (see reconcile.py).

Every attempt, committed or rolled back, is one JSON line in --log.
"""
import argparse
import json
import random
import sys
import threading
import time

import psycopg2

TOPIC = "webhooks.fulfilment"
SEQ = {"order.created": 1, "order.paid": 2, "order.shipped": 3, "order.refunded": 4}

ABANDONED = {7, 23}                       # creation rolled back: out of stock
DECLINED_FIRST = {1, 7, 13, 19, 25, 31, 37}  # the first card is declined (rolled back), the second works
SHIPPED_TWICE = {4, 8, 12, 16, 20}        # the warehouse reports the shipment twice
REFUNDS = {3: "customer_request", 11: "damaged", 19: "chargeback", 27: "customer_request"}
POISON = 19                               # "chargeback": unknown to the partner, a 400
CANCELLED_REFUND = 35                     # a refund started and rolled back


class Rollback(Exception):
    """A business rule failed after the webhook was enqueued: the transaction rolls back."""


def order_id(n):
    return f"ord-{n:03d}"


class Shop:
    def __init__(self, dsn, log_path, rng):
        self.dsn = dsn
        self.log = open(log_path, "a")
        self.lock = threading.Lock()
        self.rng = rng

    def record(self, **entry):
        entry["t"] = time.time()
        with self.lock:
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()

    @staticmethod
    def emit(cur, order, type_, event_id, data):
        """Enqueues the webhook and records the business event, in the caller's transaction."""
        payload = {"id": event_id, "type": type_, "order_id": order, "seq": SEQ[type_], "data": data}
        cur.execute("""SELECT idempotency.outbox_enqueue(%s, %s, key => %s, headers => %s, dedup_key => %s)""",
                    (TOPIC, json.dumps(payload), order, json.dumps({"X-Event-Type": type_}), event_id))
        outbox_id = cur.fetchone()[0]
        cur.execute("""INSERT INTO order_events (event_id, order_id, type, seq, outbox_id)
                       VALUES (%s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING""",
                    (event_id, order, type_, SEQ[type_], outbox_id))
        return outbox_id

    def transaction(self, conn, order, type_, event_id, body):
        """Runs body(cur) -> data in one transaction that also enqueues the event;
        logs whether it committed."""
        outbox_id = None
        try:
            with conn, conn.cursor() as cur:       # commits, or rolls back on an exception
                data, rollback = body(cur)
                outbox_id = self.emit(cur, order, type_, event_id, data)
                if rollback:
                    hold, why = rollback
                    time.sleep(hold)               # the event sits uncommitted meanwhile
                    raise Rollback(why)
        except Rollback as why:
            self.record(event_id=event_id, order_id=order, type=type_, committed=False,
                        outbox_id=outbox_id, reason=str(why))
            return None
        self.record(event_id=event_id, order_id=order, type=type_, committed=True, outbox_id=outbox_id)
        return outbox_id

    def create(self, conn, n):
        order = order_id(n)
        amount = 1000 + 37 * n

        def body(cur):
            cur.execute("INSERT INTO orders (id, customer, amount_cents, status) VALUES (%s, %s, %s, 'created')",
                        (order, f"customer-{n % 9}", amount))
            return {"customer": f"customer-{n % 9}", "amount_cents": amount, "currency": "EUR"}, \
                (0.0, "out of stock") if n in ABANDONED else None
        return self.transaction(conn, order, "order.created", f"evt_created_{order}", body)

    def pay(self, conn, n, attempt, declined, hold=0.0):
        order = order_id(n)
        payment = f"pay-{n:03d}-{attempt}"

        def body(cur):
            cur.execute("INSERT INTO payments (id, order_id, amount_cents) "
                        "SELECT %s, id, amount_cents FROM orders WHERE id = %s RETURNING amount_cents",
                        (payment, order))
            amount = cur.fetchone()[0]
            cur.execute("UPDATE orders SET status = 'paid', updated_at = now() WHERE id = %s AND status = 'created'",
                        (order,))
            return {"payment_id": payment, "amount_cents": amount, "currency": "EUR"}, \
                (hold, "card declined") if declined else None
        return self.transaction(conn, order, "order.paid", f"evt_paid_{payment}", body)

    def ship(self, conn, n):
        order = order_id(n)
        shipment = f"shp-{n:03d}"

        def body(cur):
            # Idempotent: a second report of the same shipment changes nothing.
            cur.execute("""UPDATE orders SET status = 'shipped', updated_at = now()
                            WHERE id = %s AND status IN ('paid', 'shipped')""", (order,))
            return {"shipment_id": shipment, "carrier": "parcel-co"}, None
        return self.transaction(conn, order, "order.shipped", f"evt_shipped_{shipment}", body)

    def refund(self, conn, n, reason, cancel):
        order = order_id(n)
        refund = f"ref-{n:03d}"

        def body(cur):
            cur.execute("INSERT INTO refunds (id, order_id, reason) VALUES (%s, %s, %s)", (refund, order, reason))
            cur.execute("UPDATE orders SET status = 'refunded', updated_at = now() WHERE id = %s RETURNING amount_cents",
                        (order,))
            return {"refund_id": refund, "reason": reason, "amount_cents": cur.fetchone()[0]}, \
                (0.2, "refund cancelled") if cancel else None
        return self.transaction(conn, order, "order.refunded", f"evt_refunded_{refund}", body)

    def pause(self):
        with self.lock:
            delay = self.rng.uniform(0.05, 0.2)
        time.sleep(delay)

    def life(self, conn, n):
        """One order's life, each step its own transaction."""
        if self.create(conn, n) is None:
            return
        self.pause()
        if n in DECLINED_FIRST:
            # The first of these holds its uncommitted event for half a second.
            self.pay(conn, n, 1, declined=True, hold=0.5 if n == 1 else 0.0)
            self.pause()
            self.pay(conn, n, 2, declined=False)
        else:
            self.pay(conn, n, 1, declined=False)
        self.pause()
        first = self.ship(conn, n)
        if n in SHIPPED_TWICE:
            self.pause()
            again = self.ship(conn, n)
            self.record(event_id=f"evt_shipped_shp-{n:03d}", order_id=order_id(n), type="order.shipped",
                        reported_twice=True, same_outbox_id=first == again, outbox_id=first, again=again)
            if first != again:
                raise RuntimeError(f"the second report of shipment {n} was enqueued again: {first} != {again}")
        if n in REFUNDS or n == CANCELLED_REFUND:
            self.pause()
            self.refund(conn, n, REFUNDS.get(n, "customer_request"), cancel=n == CANCELLED_REFUND)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--orders", type=int, default=40)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--log", required=True, help="JSON lines: every attempted event, committed or not")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    shop = Shop(args.dsn, args.log, random.Random(args.seed))
    errors = []

    def run(numbers):
        try:
            conn = psycopg2.connect(args.dsn, application_name="shop")
            for n in numbers:
                shop.life(conn, n)
            conn.close()
        except Exception as error:              # reported below; the exit status says it
            errors.append(f"{type(error).__name__}: {error}")

    numbers = list(range(1, args.orders + 1))
    threads = [threading.Thread(target=run, args=(numbers[i::args.threads],)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        print("app: " + "\n".join(errors), file=sys.stderr)
        return 1
    print(f"app: {args.orders} orders done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
