#!/usr/bin/python3
"""A worker of the chaos test's 3-step jobs, written with the Python
client's step API (clients/python) as an application would write it:

    loop:  outbox_claim('steps-N', batch, lease, topics => '{steps}')
    per job, with claim(conn, key, request, scope='steps') as job:
      reserve = job.step('reserve', ...)  INSERT INTO reservations, in the
                                          step's transaction (the row and the
                                          step's record commit together)
      charge  = job.step('charge', ...)   POST /charges to the payment API
                                          with Idempotency-Key = step.key
                                          (idem_step_key(key, 'charge'))
      email   = job.step('email', ...)    POST /emails to the mail API with
                                          Idempotency-Key = step.key
      job.result = the three ids          leaving the block completes the key
    then outbox_ack; a claim answered completed -> ack (replay); in_progress
    or retry_later -> nack; a provider that failed (503, timeouts) fails the
    key retryable (the client's idem_fail) -> nack; fenced (IK001) -> nack

A claim that resumes a key is given its finished steps, and job.step
returns their stored results instead of running them again: the worker
resumes after the last one. No heartbeat: the lease is the claim's
(--key-lease), so that a completion after it counts as late, as for the
other workers.

The job's fault plan (payload.fault, see chaoslib.STEP_FAULTS) makes the
worker SIGKILL itself on the first claim of its key, inside a step (its
effect done: the reservation row written or the provider's answer in hand,
its record not committed) or right after a step was recorded (before the
next step, or the complete). Every step is logged to --log before its
effect; a lost database connection abandons the current batch.
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The client from this tree, as the application's dependency.
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python", "src"))

import psycopg  # noqa: E402
from pg_idempotency import NotClaimed, RetryableError, claim  # noqa: E402

from chaoslib import STEP_SCOPE, STEP_TOPIC, Lost, Process  # noqa: E402
from client_connection import connect, connection_lost  # noqa: E402
from providers import Provider  # noqa: E402

OUTBOX_CLAIM = ("SELECT id, payload, attempt FROM idempotency.outbox_claim(%s, %s,"
                " make_interval(secs => %s), topics => %s)")
OUTBOX_ACK = "SELECT idempotency.outbox_ack(ARRAY[%s]::bigint[])"
OUTBOX_NACK = ("SELECT idempotency.outbox_nack(%s, %s, retryable => true,"
               " retry_in => make_interval(secs => %s))::text")


class ProviderFailed(RetryableError):
    """A provider's call failed (503, or no answer after the retries): the
    key fails, to be retried soon."""

    def __init__(self, message):
        super().__init__(message, retry_in=0.2)


class StepWorker(Process):
    def __init__(self, args):
        super().__init__(args, connect)
        self.payments = Provider(args.api, args.http_timeout, self.log)
        self.mail = Provider(args.mail_api, args.http_timeout, self.log)

    # ------------------------------------------------------------ database
    def settle(self, sql, params):
        conn = self.db()
        with conn.transaction():
            return conn.execute(sql, params).fetchone()[0]

    def ack(self, ev_id, key, why):
        changed = self.settle(OUTBOX_ACK, (ev_id,))
        self.log("ack", key=key, id=ev_id, why=why, changed=changed)

    def nack(self, ev_id, key, why, delay):
        state = self.settle(OUTBOX_NACK, (ev_id, why, delay))
        self.log("nack", key=key, id=ev_id, why=why, state=state)
        return state

    # ------------------------------------------------------------ faults
    def die(self, where, key, token):
        self.log("kill", step=where, key=key, token=token)
        os.kill(os.getpid(), signal.SIGKILL)

    # ------------------------------------------------------------ the steps
    def step(self, job, name, effect, plan):
        """job.step(name, ...) with the step's effect, the log lines and the
        planned kills around it. Returns the step's result (stored, when it
        finished before this claim)."""
        ran = []

        def run(step):
            ran.append(step.key)
            self.log("step_run", key=job.key, step=name, token=job.token, attempt=job.attempt,
                     call_key=step.key)
            result = effect(step)
            if plan == f"kill_in_{name}":
                self.die(f"in_{name}", job.key, job.token)
            return result

        result = job.step(name, run)
        if ran:
            self.log("step_recorded", key=job.key, step=name, token=job.token, attempt=job.attempt,
                     result=result)
            if plan == f"kill_after_{name}":
                self.die(f"after_{name}", job.key, job.token)
        return result

    def run_steps(self, job, amount, plan):
        key = job.key

        def reserve(step):
            row = step.conn.execute(
                "INSERT INTO reservations (job_key, amount_cents, worker, token)"
                " VALUES (%s, %s, %s, %s) RETURNING id", (key, amount, self.name, job.token)).fetchone()
            return {"reservation_id": row[0]}

        def charge(step):
            response, error = self.payments.post("/charges", step.key, {"amount_cents": amount, "job": key},
                                                 key=key, step="charge", call_key=step.key)
            if response is None:
                raise ProviderFailed(f"payment API: {error}")
            return {"charge_id": response["id"]}

        def email(step):
            response, error = self.mail.post("/emails", step.key, {
                "to": f"{key}@customers.test", "job": key, "charge_id": charged["charge_id"]},
                key=key, step="email", call_key=step.key)
            if response is None:
                raise ProviderFailed(f"mail API: {error}")
            return {"message_id": response["id"]}

        reserved = self.step(job, "reserve", reserve, plan)
        charged = self.step(job, "charge", charge, plan)
        emailed = self.step(job, "email", email, plan)
        job.result = {**reserved, **charged, **emailed}

    # ------------------------------------------------------------ one job
    def handle(self, event):
        ev_id, payload, delivery = event
        key, amount, fault = payload["job"], payload["amount_cents"], payload.get("fault")
        try:
            with claim(self.db(), key, {"amount_cents": amount}, scope=STEP_SCOPE,
                       lease=self.args.key_lease, heartbeat=False) as job:
                self.log("claim", key=key, outcome="claimed", token=job.token, attempt=job.attempt,
                         steps=list(job.steps), delivery=delivery)
                self.run_steps(job, amount, fault if job.attempt == 1 else None)
        except NotClaimed as answer:
            job = answer.job
            self.log("claim", key=key, outcome=job.outcome, token=job.token, attempt=job.attempt,
                     result=job.result, delivery=delivery)
            if job.outcome == "completed":
                self.ack(ev_id, key, "replay")
            elif job.outcome in ("in_progress", "retry_later"):
                self.nack(ev_id, key, job.outcome, max(0.1, min(job.retry_after or 0.0, 1.0)))
            else:
                self.log("violation", what=f"claim answered {job.outcome}", key=key, error=job.error)
                self.nack(ev_id, key, job.outcome, 1.0)
            return

        if job.outcome == "completed":
            self.log("complete", key=key, token=job.token, attempt=job.attempt, result=job.result)
            self.ack(ev_id, key, "done")
        elif job.outcome == "fenced":
            # Someone claimed the key after our lease ended: the step's
            # transaction (or the complete's) rolled back.
            self.log("stale", key=key, token=job.token, call="step or complete")
            self.nack(ev_id, key, "fenced", 0.2)
        elif isinstance(job.exception, ProviderFailed):
            state = self.nack(ev_id, key, job.error, 0.2)
            self.log("fail", key=key, token=job.token, error=job.error, id=ev_id, state=state)
        else:
            # The client recorded a failure that nothing here should cause
            # (IK004: a step recorded twice, a database error).
            exc = job.exception
            self.log("violation", what=f"job ended {job.outcome}", key=key,
                     sqlstate=getattr(exc, "sqlstate", None), error=str(exc).strip())
            self.nack(ev_id, key, "unexpected", 1.0)

    # ------------------------------------------------------------ main loop
    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        self.log("start", pid=os.getpid())
        idle = 0.05
        while not self.stopping:
            conn = None
            try:
                conn = self.db()
                with conn.transaction():
                    events = conn.execute(OUTBOX_CLAIM, (self.name, self.args.batch, self.args.outbox_lease,
                                                         [STEP_TOPIC])).fetchall()
                if not events:
                    time.sleep(idle)
                    idle = min(idle * 2, 0.2)
                    continue
                idle = 0.05
                self.log("batch", ids=[e[0] for e in events])
                for event in events:
                    if self.stopping:
                        break  # the rest comes back when the lease ends
                    self.handle(event)
            except Lost as e:
                self.log("lost", error=str(e))
                time.sleep(0.1)
            except psycopg.Error as e:
                if connection_lost(e, conn):
                    self.drop()
                    self.log("lost", error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
                    time.sleep(0.1)
                    continue
                self.log("violation", what="unexpected database error", sqlstate=e.sqlstate,
                         error=str(e).strip())
                self.drop()
                time.sleep(0.2)
        self.drop()
        self.log("stop")
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--api", required=True, help="the payment API, http://127.0.0.1:PORT")
    p.add_argument("--mail-api", required=True, help="the mail API, http://127.0.0.1:PORT")
    p.add_argument("--log", required=True)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--outbox-lease", type=float, default=3.0)
    p.add_argument("--key-lease", type=float, default=2.0)
    p.add_argument("--http-timeout", type=float, default=0.5)
    return StepWorker(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
