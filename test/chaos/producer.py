#!/usr/bin/python3
"""A producer of the chaos test: the API side of the job queue.

Each submission is one transaction, as an API request would be:

    BEGIN;
    SELECT idem_register(key, request, job_ref => key);          -- ingress dedup
    SELECT outbox_enqueue('jobs', payload, dedup_key => key);     -- the job
    COMMIT;

A share of the new jobs (--step-rate) are 3-step jobs (keys `step-`, scope
and topic 'steps', done by step_worker.py): the same transaction with that
scope and topic.

What it submits, drawn from an RNG seeded with --seed and --index:
  - new jobs, each with a fault plan in its payload (what the worker that
    first gets it will do to itself: see chaoslib.FAULTS); a 3-step job's
    plan takes the next of chaoslib.STEP_FAULTS and two plans without a
    fault in turn (from a random place), so that every kill between and
    inside steps is planned in a short run;
  - duplicate submissions of keys it committed before, soon after (the key is
    usually still queued or processing: `in_progress`) or much later (usually
    done: `completed` with the stored result); the enqueue then adds nothing
    thanks to dedup_key;
  - racing duplicates: a new key submitted from two connections at once (one
    registers it, the other waits for that transaction and answers
    `in_progress`);
  - rolled-back submissions (keys prefixed `rb-`), which must leave no trace.

Every submission's fate is one line in --log: committed (with the register
answer), rolled_back, or, when the connection broke, not committed (before
COMMIT) or unknown (during COMMIT). A broken submission is retried with the
same key after reconnecting, as an API client would. Runs --seconds, then
logs `done` and exits 0.
"""

import argparse
import random
import signal
import sys
import threading
import time

import psycopg2
from psycopg2.extras import Json

from chaoslib import FAULTS, FENCE_SQL, STEP_FAULTS, STEP_SCOPE, STEP_TOPIC, JsonLog, connect, connection_lost


class Producer:
    def __init__(self, args):
        self.args = args
        self.log = JsonLog(args.log)
        self.rng = random.Random(args.seed * 7919 + args.index)
        self.stopping = False
        self.conns = {}
        self.committed = []   # keys this producer created, in order
        self.jobs = {}        # key -> (amount, fault) of every key it submitted
        self.step_plans = STEP_FAULTS + (None, None)
        self.step_jobs = self.rng.randrange(len(self.step_plans))   # where the turn starts
        weights = [float(w) for w in args.fault_weights.split(",")]
        assert len(weights) == len(FAULTS)
        self.fault_weights = weights

    def db(self, slot):
        conn = self.conns.get(slot)
        if conn is None or conn.closed:
            conn = connect(self.args.dsn, f"chaos-producer-{self.args.index}.{slot}",
                           stop=lambda: self.stopping)
            if conn is None:
                raise SystemExit(0)
            self.conns[slot] = conn
        return conn

    def drop(self, slot):
        conn = self.conns.pop(slot, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def plan(self):
        r = self.rng.random()
        for fault, weight in zip(FAULTS, self.fault_weights):
            if r < weight:
                return fault
            r -= weight
        return None

    def submit(self, key, kind, rollback=False, slot=0):
        """One submission, retried with the same key until it is decided."""
        amount, fault = self.jobs[key]
        steps = key.startswith("step-")
        scope, topic = (STEP_SCOPE, STEP_TOPIC) if steps else ("default", "jobs")
        request = {"amount_cents": amount}
        payload = {"job": key, "amount_cents": amount, "fault": fault}
        tries = 0
        while True:
            tries += 1
            phase = "begin"
            try:
                conn = self.db(slot)
                with conn.cursor() as cur:
                    cur.execute(FENCE_SQL)
                    phase = "register"
                    cur.execute("SELECT outcome, result FROM idempotency.idem_register(%s, %s, job_ref => %s,"
                                " scope => %s)", (key, Json(request), key, scope))
                    outcome, result = cur.fetchone()
                    # Answers are counted by the server at the call: log them now.
                    self.log("answer", key=key, outcome=outcome, result=result, kind=kind)
                    phase = "enqueue"
                    cur.execute("SELECT idempotency.outbox_enqueue(%s, %s, dedup_key => %s)",
                                (topic, Json(payload), key))
                    event_id = cur.fetchone()[0]
                if rollback:
                    conn.rollback()
                    self.log("submit", key=key, kind=kind, fate="rolled_back", outcome=outcome)
                    return outcome
                phase = "commit"
                conn.commit()
                self.log("submit", key=key, kind=kind, fate="committed", outcome=outcome,
                         event_id=event_id, fault=fault, tries=tries)
                return outcome
            except psycopg2.Error as e:
                if not connection_lost(e, self.conns.get(slot)):
                    # Not a lost connection: unexpected. Log it and give up on this key.
                    self.log("violation", what="producer error", key=key, phase=phase,
                             sqlstate=e.pgcode, error=str(e).strip())
                    try:
                        self.conns[slot].rollback()
                    except Exception:
                        self.drop(slot)
                    return None
                self.drop(slot)
                fate = "unknown" if phase == "commit" else "not_committed"
                self.log("submit", key=key, kind=kind, fate=fate, phase=phase,
                         error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
                if self.stopping:
                    return None
                time.sleep(0.05)

    def new_job(self, prefix):
        key = f"{prefix}-{self.args.index}-{len(self.jobs):05d}"
        self.jobs[key] = (self.rng.randint(100, 99999), self.plan())
        return key

    def new_step_job(self):
        key = f"step-{self.args.index}-{len(self.jobs):05d}"
        plan = self.step_plans[self.step_jobs % len(self.step_plans)]
        self.step_jobs += 1
        self.jobs[key] = (self.rng.randint(100, 99999), plan)
        return key

    def step(self):
        r = self.rng.random()
        a = self.args
        if r < a.rollback_rate:
            self.submit(self.new_job("rb"), "rollback", rollback=True)
        elif r < a.rollback_rate + a.dup_rate and self.committed:
            if self.rng.random() < 0.5:
                key = self.rng.choice(self.committed[-10:])
                self.submit(key, "dup_soon")
            else:
                key = self.rng.choice(self.committed)
                self.submit(key, "dup_late")
        elif r < a.rollback_rate + a.dup_rate + a.race_rate:
            key = self.new_job("job")
            # The same key from a second connection at the same moment.
            twin = threading.Thread(target=self.submit, args=(key, "race"), kwargs={"slot": 1})
            twin.start()
            self.submit(key, "race")
            twin.join()
            self.committed.append(key)
        else:
            key = self.new_step_job() if self.rng.random() < a.step_rate else self.new_job("job")
            if self.submit(key, "new") is not None:
                self.committed.append(key)

    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        end = time.monotonic() + self.args.seconds
        period = 1.0 / self.args.rate
        next_at = time.monotonic()
        while time.monotonic() < end and not self.stopping:
            self.step()
            next_at += self.rng.uniform(0.2, 1.8) * period
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.monotonic()
        self.log("done", jobs=len(self.committed))
        for slot in list(self.conns):
            self.drop(slot)
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--rate", type=float, default=10.0, help="submissions per second")
    p.add_argument("--log", required=True)
    p.add_argument("--rollback-rate", type=float, default=0.06)
    p.add_argument("--dup-rate", type=float, default=0.15)
    p.add_argument("--race-rate", type=float, default=0.04)
    p.add_argument("--step-rate", type=float, default=0.0, help="the share of new jobs that are 3-step jobs")
    p.add_argument("--fault-weights", required=True,
                   help="probabilities of " + ",".join(FAULTS) + " per new job")
    return Producer(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
