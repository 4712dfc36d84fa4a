#!/usr/bin/python3
"""A worker of the chaos test: consumes the outbox as a job queue.

    loop:  outbox_claim('worker-N', batch, lease, topics => '{jobs}')
    per job:
      idem_claim(key, request, lease)
        claimed     -> side effect 1: POST /charges to the mock payment API with
                       Idempotency-Key = the job key (a timeout is retried with
                       the same key, which replays; a 503 -> idem_fail retryable
                       + outbox_nack);
                       side effect 2, in ONE transaction:
                         INSERT INTO ledger ...; idem_complete(key, token, result)
                       then outbox_ack
        completed   -> outbox_ack (the work was done; its result is replayed)
        in_progress / retry_later -> outbox_nack with a short retry_in
        failed / mismatch -> cannot happen here: logged as a violation

The job's fault plan (payload.fault) makes the worker SIGKILL itself at a
step on the job's first delivery (kill_before_claim, kill_after_complete) or
the first claim of its key (kill_after_effect), or stall past its lease
before the complete (stall_late: the late complete is accepted because nobody
claimed since; stall_fenced: waits until another worker took the key over, so
the complete raises IK001 and its ledger row rolls back). Every step is logged
to --log before it is taken. A lost database connection abandons the current
batch (its events come back when their lease ends) and reconnects.
"""

import argparse
import os
import signal
import sys
import time

import psycopg2
from psycopg2.extras import Json

from chaoslib import FENCE_SQL, STALLS, Lost, Process, connect, connection_lost, interval
from providers import Provider


class Worker(Process):
    def __init__(self, args):
        super().__init__(args, connect)
        self.api = Provider(args.api, args.http_timeout, self.log)

    # ------------------------------------------------------------ database
    def txn(self, body, fence_first=True):
        """Runs body(cur) in one transaction that holds the fence (see
        chaoslib) from before its first extension call to its end. Raises Lost
        when the connection breaks; other errors propagate after a rollback."""
        conn = self.db()
        try:
            with conn.cursor() as cur:
                if fence_first:
                    cur.execute(FENCE_SQL)
                result = body(cur)
            conn.commit()
            return result
        except psycopg2.Error as e:
            if connection_lost(e, conn):
                self.drop()
                raise Lost(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            self.rollback(conn)
            raise
        except BaseException:
            self.rollback(conn)
            raise

    def rollback(self, conn):
        try:
            conn.rollback()
        except psycopg2.Error:
            self.drop()

    # ------------------------------------------------------------ faults
    def die(self, step, key):
        self.log("kill", step=step, key=key)
        os.kill(os.getpid(), signal.SIGKILL)

    # ------------------------------------------------------------ the mock API
    def charge(self, key, amount):
        """Side effect 1. Returns (response, None) or (None, error)."""
        return self.api.post("/charges", key, {"amount_cents": amount, "job": key}, key=key)

    # ------------------------------------------------------------ one job
    def handle(self, event):
        ev_id, payload, delivery = event["id"], event["payload"], event["attempt"]
        key, amount, fault = payload["job"], payload["amount_cents"], payload.get("fault")
        request = Json({"amount_cents": amount})
        lease = interval(self.args.key_lease)

        if fault == "kill_before_claim" and delivery == 1:
            self.die("before_claim", key)

        for _ in range(3):  # a fenced complete looks again, at most a few times
            def claim(cur):
                cur.execute("SELECT outcome, token, attempt, result, error,"
                            "       extract(epoch FROM retry_after)::float8"
                            "  FROM idempotency.idem_claim(%s, %s, lease => %s::interval)",
                            (key, request, lease))
                return cur.fetchone()
            outcome, token, attempt, result, error, retry_after = self.txn(claim)
            self.log("claim", key=key, outcome=outcome, token=token, attempt=attempt,
                     result=result, delivery=delivery)

            if outcome == "completed":
                self.ack(ev_id, key, "replay")
                return
            if outcome in ("in_progress", "retry_later"):
                delay = max(0.1, min(retry_after or 0.0, 1.0))
                self.nack(ev_id, key, outcome, delay)
                return
            if outcome != "claimed":
                self.log("violation", what=f"claim answered {outcome}", key=key, error=error)
                self.nack(ev_id, key, outcome, 1.0)
                return

            response, api_error = self.charge(key, amount)
            if response is None:
                def fail(cur):
                    cur.execute("SELECT idempotency.idem_fail(%s, %s, %s, retryable => true,"
                                " retry_in => '200ms')", (key, token, f"payment API: {api_error}"))
                    cur.execute("SELECT idempotency.outbox_nack(%s, %s, retryable => true,"
                                " retry_in => '200ms')::text", (ev_id, f"payment API: {api_error}"))
                    return cur.fetchone()[0]
                try:
                    state = self.txn(fail)
                except psycopg2.Error as e:
                    if e.pgcode != "IK001":
                        raise
                    self.log("stale", key=key, token=token, call="fail")
                    return
                self.log("fail", key=key, token=token, error=api_error, id=ev_id, state=state)
                return

            if attempt == 1:
                if fault == "kill_after_effect":
                    self.die("after_effect", key)
                if fault == "stall_late":
                    self.log("stall", key=key, kind="late", token=token)
                    time.sleep(self.args.key_lease + 0.6)
                if fault == "stall_fenced":
                    self.log("stall", key=key, kind="fenced", token=token)
                    self.wait_for_takeover(key, token)

            def complete(cur):
                # The ledger row first, then the fence, then the complete: a
                # restart can cut this transaction with the row written.
                cur.execute("INSERT INTO ledger (job_key, amount_cents, charge_id, worker, token)"
                            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                            (key, amount, response["id"], self.name, token))
                ledger_id = cur.fetchone()[0]
                cur.execute(FENCE_SQL)
                cur.execute("SELECT outcome FROM idempotency.idem_complete(%s, %s, %s)",
                            (key, token, Json({"charge_id": response["id"], "ledger_id": ledger_id})))
                return cur.fetchone()[0]
            try:
                self.txn(complete, fence_first=False)
            except psycopg2.Error as e:
                if e.pgcode != "IK001":
                    raise
                # Fenced: someone claimed the key after our lease ended; our
                # ledger row rolled back. Look again: it is usually done.
                self.log("stale", key=key, token=token, call="complete",
                         stall=fault if attempt == 1 and fault in STALLS else None)
                continue
            self.log("complete", key=key, token=token, attempt=attempt,
                     stall=fault if attempt == 1 and fault in STALLS else None)
            if fault == "kill_after_complete" and delivery == 1:
                self.die("after_complete", key)
            self.ack(ev_id, key, "done")
            return
        self.nack(ev_id, key, "fenced repeatedly", 0.2)

    def wait_for_takeover(self, key, token, limit=15.0):
        """Sleeps until another worker holds the key (its token changed)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            time.sleep(0.2)
            def current(cur):
                cur.execute("SELECT token FROM idempotency.idem_get(%s)", (key,))
                row = cur.fetchone()
                return row[0] if row else None
            if self.txn(current, fence_first=False) != token:
                return
        self.log("stall_timeout", key=key, token=token)

    def ack(self, ev_id, key, why):
        def body(cur):
            cur.execute("SELECT idempotency.outbox_ack(ARRAY[%s]::bigint[])", (ev_id,))
            return cur.fetchone()[0]
        changed = self.txn(body)
        self.log("ack", key=key, id=ev_id, why=why, changed=changed)

    def nack(self, ev_id, key, why, delay):
        def body(cur):
            cur.execute("SELECT idempotency.outbox_nack(%s, %s, retryable => true,"
                        " retry_in => %s::interval)::text", (ev_id, why, interval(delay)))
            return cur.fetchone()[0]
        state = self.txn(body)
        self.log("nack", key=key, id=ev_id, why=why, state=state)

    # ------------------------------------------------------------ main loop
    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        self.log("start", pid=os.getpid())
        idle = 0.05
        while not self.stopping:
            try:
                def claim(cur):
                    cur.execute("SELECT id, payload, attempt FROM idempotency.outbox_claim("
                                "%s, %s, %s::interval, topics => '{jobs}')",
                                (self.name, self.args.batch, interval(self.args.outbox_lease)))
                    return [dict(id=r[0], payload=r[1], attempt=r[2]) for r in cur.fetchall()]
                events = self.txn(claim)
                if not events:
                    time.sleep(idle)
                    idle = min(idle * 2, 0.2)
                    continue
                idle = 0.05
                self.log("batch", ids=[e["id"] for e in events])
                for event in events:
                    if self.stopping:
                        break  # the rest comes back when the lease ends
                    self.handle(event)
            except Lost as e:
                self.log("lost", error=str(e))
                time.sleep(0.1)
            except psycopg2.Error as e:
                self.log("violation", what="unexpected database error", sqlstate=e.pgcode,
                         error=str(e).strip())
                time.sleep(0.2)
        self.drop()
        self.log("stop")
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--api", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--log", required=True)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--outbox-lease", type=float, default=3.0)
    p.add_argument("--key-lease", type=float, default=2.0)
    p.add_argument("--http-timeout", type=float, default=0.5)
    return Worker(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
