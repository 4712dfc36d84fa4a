#!/usr/bin/python3
"""The at-least-once demo of the idempotency extension (`make demo`).

A simulated broker delivers 200 "charge customer" jobs at least once to four
worker processes. Like a real broker it duplicates deliveries (sometimes to
two workers at the same moment), redelivers what was not acked within its
visibility timeout, and redelivers after a nack. Its world injects faults:
transient errors, a declined card, a card provider that never recovers, a
worker that dies after its COMMIT but before its ack, a worker killed
(SIGKILL) while it holds a claim, and a worker frozen (SIGSTOP) past its lease
that later comes back.

Every delivery goes through the extension, in one of two patterns:

  in-transaction (wallet charges, all in our database):
      BEGIN; idem_claim; INSERT charge; idem_complete(result); COMMIT
      Claim, charge and completion commit or roll back together; a duplicate
      arriving meanwhile waits for that transaction, then replays the result.

  two-phase (card charges, with a call to an external card provider):
      idem_claim with a short lease (commits at once); call the provider
      outside any transaction; BEGIN; INSERT charge; idem_complete; COMMIT.
      If the lease ran out and someone else took the key over, idem_complete
      raises IK001 (stale token) and the late worker's charge rolls back.

The charges table deliberately has no unique constraint on the job: only the
extension stands between a duplicate delivery and a double charge. At the
end a SQL proof checks that every job was charged exactly once.

Usage: demo.py --host SOCKET_DIR --port PORT --dbname DB [--seed N] [--verbose]
"""

import argparse
import heapq
import itertools
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from collections import Counter, deque, namedtuple
from multiprocessing.connection import wait as wait_for_pipes

import psycopg2
from psycopg2.extras import Json

SCOPE = "payment.charge"
JOBS = 200
WORKERS = 4
VISIBILITY_TIMEOUT = 1.2   # seconds: the broker redelivers what is not acked by then
CARD_LEASE = 0.8           # seconds: two-phase claims hold a short lease
SLOW_LEASE = 1.0           # seconds: the slow card call keeps its lease alive by heartbeat
MAX_ATTEMPTS = 3
RUN_LIMIT = 45             # seconds: the scenario gives up (and fails) after this
SESSION_SETTINGS = {       # every worker session SETs these for its own calls
    "idempotency.retry_base_delay": "50ms",
    "idempotency.max_attempts": str(MAX_ATTEMPTS),
}

# The faults the simulated world injects, each on its own job(s).
FAULTS = {  # name: (method, how many jobs, what happens)
    "transient": (None, 8, "first attempt fails with a retryable error"),
    "declined": ("card", 1, "card declined: fails for good, must never be charged"),
    "flaky": ("card", 1, f"card provider down on all {MAX_ATTEMPTS} attempts: fails for good"),
    "crash_after_commit": ("wallet", 2, "worker dies after COMMIT, before its ack"),
    "killed": ("card", 1, "worker SIGKILLed mid-call while it holds the claim"),
    "frozen": ("card", 1, "worker frozen (SIGSTOP) past its lease, then comes back late"),
    "slow": ("card", 1, "provider call outlasts the visibility timeout; lease kept by heartbeat"),
}
MEANT_TO_FAIL = ("declined", "flaky")


def money(cents):
    return f"${cents / 100:,.2f}"


# --------------------------------------------------------------------------
# The simulated outside world: the card provider and the ledger.

class Transient(Exception):
    """A failure worth retrying (timeouts, 503s)."""


class Declined(Exception):
    """A failure that no retry will fix."""


def card_provider(job, attempt, pause):
    """The card provider's API: slow, sometimes unavailable, sometimes says no.
    (A real call would pass the job's key as the provider's Idempotency-Key.)"""
    fault = job["fault"]
    if fault == "slow" or (fault in ("killed", "frozen") and attempt == 1):
        pause({"killed": 1.5, "frozen": 0.6, "slow": 2.0}[fault])
    else:
        pause(random.uniform(0.02, 0.06))
    if fault == "declined":
        raise Declined("card declined: do_not_honor")
    if fault == "flaky" or (fault == "transient" and attempt == 1):
        raise Transient("provider: 503 Service Unavailable")
    return f"pi_{job['job_id']:04d}_{attempt}"


def ledger_post(job, attempt):
    """Posting to the internal ledger; it times out now and then."""
    time.sleep(random.uniform(0.003, 0.012))
    if job["fault"] == "transient" and attempt == 1:
        raise Transient("ledger: lock timeout")


# --------------------------------------------------------------------------
# Worker processes: each takes one delivery at a time from the broker and
# processes it through the extension.

Claim = namedtuple("Claim", "outcome token attempt result error retry_after waited")


class Fenced(Exception):
    pass


class Worker:
    def __init__(self, name, pipe, cur):
        self.name, self.pipe, self.cur = name, pipe, cur

    def say(self, kind, d, **fields):
        self.pipe.send(("event", dict(kind=kind, job_id=d["job_id"], nth=d["nth"], **fields)))

    # ---- the extension's calls
    def claim(self, d, lease=None):
        started = time.monotonic()
        self.cur.execute(
            "SELECT outcome, token, attempt, result, error,"
            "       extract(epoch FROM retry_after)::float8"
            "  FROM idempotency.idem_claim(%s, %s, lease => %s::interval, scope => %s)",
            (d["key"], Json({"customer": d["customer"], "amount_cents": d["amount_cents"]}),
             None if lease is None else f"{lease}s", SCOPE))
        return Claim(*self.cur.fetchone(), waited=time.monotonic() - started)

    def complete(self, d, token, result):
        self.cur.execute("SELECT outcome FROM idempotency.idem_complete(%s, %s, %s, scope => %s)",
                         (d["key"], token, Json(result), SCOPE))
        return self.cur.fetchone()[0]

    def fail(self, d, token, error, retryable):
        self.cur.execute("SELECT idempotency.idem_fail(%s, %s, %s, retryable => %s, scope => %s)",
                         (d["key"], token, error, retryable, SCOPE))
        return self.cur.fetchone()[0]

    def heartbeat(self, d, token, extend):
        self.cur.execute("SELECT idempotency.idem_heartbeat(%s, %s, extend => %s::interval,"
                         " scope => %s)", (d["key"], token, f"{extend}s", SCOPE))

    # ---- the business write
    def record_charge(self, d, token, provider_ref=None):
        self.cur.execute(
            "INSERT INTO charges (job_id, customer, amount_cents, provider_ref, worker, token)"
            " VALUES (%s, %s, %s, %s, %s, %s) RETURNING charge_id",
            (d["job_id"], d["customer"], d["amount_cents"], provider_ref, self.name, token))
        return self.cur.fetchone()[0]

    def rollback(self):
        if self.cur.connection.closed == 0:
            self.cur.execute("ROLLBACK")

    # ---- one delivery
    def handle(self, d):
        return self.charge_wallet(d) if d["method"] == "wallet" else self.charge_card(d)

    def charge_wallet(self, d):
        """The in-transaction pattern."""
        cur = self.cur
        cur.execute("BEGIN")
        try:
            c = self.claim(d)
            if c.outcome != "claimed":
                cur.execute("COMMIT")
                return self.duplicate(d, c)
            cur.execute("SAVEPOINT work")
            charge_id = self.record_charge(d, c.token)
            try:
                ledger_post(d, c.attempt)
            except Transient as e:
                cur.execute("ROLLBACK TO SAVEPOINT work")  # the charge row goes, the claim stays
                status = self.fail(d, c.token, str(e), True)
                cur.execute("COMMIT")
                return self.failed(d, c, status, e, "in-tx")
            self.complete(d, c.token, {"charge_id": charge_id, "amount_cents": d["amount_cents"]})
            cur.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        self.say("claim", d, token=c.token, attempt=c.attempt, pattern="in-tx")
        self.say("charged", d, token=c.token, attempt=c.attempt, charge_id=charge_id,
                 pattern="in-tx")
        if d["fault"] == "crash_after_commit" and d["nth"] == 1:
            self.say("crash", d, charge_id=charge_id)
            os._exit(3)  # the broker never hears the ack
        return "ack", 0

    def charge_card(self, d):
        """The two-phase pattern."""
        lease = SLOW_LEASE if d["fault"] == "slow" else CARD_LEASE
        c = self.claim(d, lease)  # autocommit: the claim is visible at once, for `lease`
        if c.outcome != "claimed":
            return self.duplicate(d, c)
        self.say("claim", d, token=c.token, attempt=c.attempt, pattern="two-phase", lease=lease)
        try:
            pause = self.heartbeating(d, c.token, lease) if d["fault"] == "slow" else time.sleep
            provider_ref = card_provider(d, c.attempt, pause)
        except (Transient, Declined) as e:
            try:
                status = self.fail(d, c.token, str(e), isinstance(e, Transient))
            except psycopg2.Error as err:
                if err.pgcode != "IK001":
                    raise
                return self.fenced(d, c.token, "idem_fail", err)
            return self.failed(d, c, status, e, "two-phase")
        except Fenced as e:
            return self.fenced(d, c.token, "idem_heartbeat", e.args[0])
        self.cur.execute("BEGIN")
        try:
            charge_id = self.record_charge(d, c.token, provider_ref)
            self.complete(d, c.token, {"charge_id": charge_id, "amount_cents": d["amount_cents"],
                                       "provider_ref": provider_ref})
            self.cur.execute("COMMIT")
        except psycopg2.Error as err:
            self.rollback()
            if err.pgcode != "IK001":
                raise
            return self.fenced(d, c.token, "idem_complete", err)
        except BaseException:
            self.rollback()
            raise
        self.say("charged", d, token=c.token, attempt=c.attempt, charge_id=charge_id,
                 pattern="two-phase")
        return "ack", 0

    def heartbeating(self, d, token, lease):
        """A pause that keeps the claim's lease alive while the provider is slow."""
        def pause(seconds):
            end = time.monotonic() + seconds
            beats = 0
            while time.monotonic() < end:
                time.sleep(min(lease / 3, max(0.0, end - time.monotonic())))
                try:
                    self.heartbeat(d, token, lease)
                except psycopg2.Error as err:
                    if err.pgcode == "IK001":
                        raise Fenced(err)
                    raise
                beats += 1
            self.say("heartbeat", d, token=token, beats=beats, lease=lease)
        return pause

    # ---- answers other than `claimed`, and the outcomes of failures
    def duplicate(self, d, c):
        if c.outcome == "completed":
            self.say("replay", d, result=c.result, waited=c.waited)
            return "ack", 0
        if c.outcome == "in_progress":
            delay = min(max(c.retry_after or 0, 0.05), 0.25)
            self.say("in_progress", d, retry_after=c.retry_after, delay=delay)
            return "nack", delay
        if c.outcome == "retry_later":
            self.say("retry_later", d, retry_after=c.retry_after, waited=c.waited)
            return "nack", (c.retry_after or 0) + 0.005
        if c.outcome == "failed":
            self.say("already_failed", d, error=c.error)
            return "ack", 0
        self.say("error", d, error=f"unexpected claim outcome {c.outcome}")
        return "ack", 0

    def failed(self, d, c, status, error, pattern):
        if pattern == "in-tx":  # its claim committed only now, with the failure
            self.say("claim", d, token=c.token, attempt=c.attempt, pattern=pattern)
        if status == "FAILED_RETRYABLE":
            self.say("failed_retryable", d, token=c.token, attempt=c.attempt, error=str(error))
            return "nack", 0.03  # the broker's own redelivery delay
        self.say("failed_final", d, token=c.token, attempt=c.attempt, error=str(error),
                 exhausted=isinstance(error, Transient))
        return "ack", 0  # dead-lettered: nothing more to do

    def fenced(self, d, token, call, err):
        self.say("fenced", d, token=token, call=call, sqlstate=getattr(err, "pgcode", None),
                 error=str(getattr(err, "pgerror", err) or err).strip().splitlines()[0])
        return "ack", 0  # the job belongs to whoever holds the key now


def worker_main(name, pipe, dsn):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the broker's to handle
    db = psycopg2.connect(application_name=f"demo-{name}", **dsn)
    db.autocommit = True  # we write BEGIN and COMMIT ourselves, so the SQL reads like the pattern
    cur = db.cursor()
    for setting, value in SESSION_SETTINGS.items():
        cur.execute("SELECT set_config(%s, %s, false)", (setting, value))
    worker = Worker(name, pipe, cur)
    pipe.send(("ready",))
    while True:
        try:
            d = pipe.recv()
        except EOFError:
            break
        if d is None:
            break
        try:
            verdict, delay = worker.handle(d)
        except Exception as e:  # not a simulated fault: a bug somewhere; the broker fails the run
            try:
                worker.rollback()
            except Exception:
                pass
            worker.say("error", d, error=f"{type(e).__name__}: {str(e).strip()}")
            verdict, delay = "nack", 0.1
        pipe.send(("done", d["no"], verdict, delay))
    db.close()


# --------------------------------------------------------------------------
# The broker: at-least-once delivery, with the faults of the scenario.

# How a worker's line names the delivery it is handling.
VIA = {"first": "delivery", "duplicate": "duplicate", "late duplicate": "late duplicate",
       "visibility timeout": "redelivery", "retry after nack": "retry"}


class Delivery:
    def __init__(self, no, job, reason):
        self.no, self.job, self.reason = no, job, reason
        self.nth = 0
        self.settled = False  # acked or nacked


class Proc:
    def __init__(self, name, process, pipe):
        self.name, self.process, self.pipe = name, process, pipe
        self.ready = False
        self.busy = None
        self.last_used = 0.0


class Narrator:
    """Short lines as things happen; routine kinds only the first few times."""

    def __init__(self, verbose, cap=3):
        self.t0 = time.monotonic()
        self.verbose, self.cap = verbose, cap
        self.shown = Counter()

    def line(self, who, key, text, routine=None):
        if routine and not self.verbose:
            self.shown[routine] += 1
            if self.shown[routine] > self.cap:
                return
        print(f"{time.monotonic() - self.t0:6.2f}s  {who:<6} {key:<12} {text}", flush=True)

    def note(self, text):
        print(f"{time.monotonic() - self.t0:6.2f}s  {text}", flush=True)


class Broker:
    def __init__(self, jobs, dsn, narrator):
        self.jobs = {j["job_id"]: j for j in jobs}
        self.dsn, self.say = dsn, narrator
        self.ctx = mp.get_context("spawn")  # workers share nothing with us, no libpq socket
        self.procs = {}
        self.names = (f"w{n}" for n in itertools.count(1))
        self.seq = itertools.count(1)
        self.ready = deque()
        self.later = []   # heap of (due, seq, Delivery): delayed duplicates and nacks
        self.timers = []  # heap of (deadline, seq, Delivery): visibility timeouts
        self.wakeups = []  # heap of (when, seq, job_id): frozen workers to resume
        self.acked = set()
        self.sent = Counter()          # deliveries per job
        self.open_claim = {}           # job_id -> (token, worker): two-phase claims not yet settled
        self.frozen = {}               # job_id -> Proc
        self.fenced_tokens = []        # tokens whose late complete was refused
        self.count = Counter()

    # ---- delivery bookkeeping
    def publish(self, job, reason, delay=0.0):
        d = Delivery(next(self.seq), job, reason)
        if delay:
            heapq.heappush(self.later, (time.monotonic() + delay, d.no, d))
        else:
            self.make_visible(d)

    def make_visible(self, d):
        # Redeliveries jump the queue, so that each job's story stays short.
        if d.reason in ("visibility timeout", "retry after nack"):
            self.ready.appendleft(d)
        else:
            self.ready.append(d)

    def spawn(self):
        name = next(self.names)
        ours, theirs = self.ctx.Pipe()
        process = self.ctx.Process(target=worker_main, args=(name, theirs, self.dsn),
                                   name=f"demo-{name}", daemon=True)
        process.start()
        theirs.close()
        self.procs[name] = Proc(name, process, ours)
        return name

    def dispatch(self):
        idle = sorted((p for p in self.procs.values() if p.ready and p.busy is None),
                      key=lambda p: p.last_used)
        while self.ready and idle:
            d, p = self.ready.popleft(), idle.pop(0)
            job = d.job
            self.sent[job["job_id"]] += 1
            d.nth = self.sent[job["job_id"]]
            p.busy, p.last_used = d, time.monotonic()
            p.pipe.send(dict(job, no=d.no, nth=d.nth))
            heapq.heappush(self.timers, (time.monotonic() + VISIBILITY_TIMEOUT, d.no, d))
            self.count["deliveries"] += 1
            self.count[f"deliveries:{d.reason}"] += 1
            if self.say.verbose:
                self.say.line(p.name, job["key"], f"<- delivery #{d.no} ({d.reason})")

    def tick(self):
        now = time.monotonic()
        while self.later and self.later[0][0] <= now:
            self.make_visible(heapq.heappop(self.later)[2])
        while self.timers and self.timers[0][0] <= now:
            d = heapq.heappop(self.timers)[2]
            if d.settled or d.job["job_id"] in self.acked:
                continue
            self.count["visibility_timeouts"] += 1
            self.say.line("broker", d.job["key"], f"no ack within {VISIBILITY_TIMEOUT}s "
                          f"(delivery #{d.no}): visible again, redelivering")
            self.publish(d.job, "visibility timeout")
        while self.wakeups and self.wakeups[0][0] <= now:
            job_id = heapq.heappop(self.wakeups)[2]
            p = self.frozen.pop(job_id, None)
            if p is not None:
                os.kill(p.process.pid, signal.SIGCONT)
                self.say.line("broker", self.jobs[job_id]["key"],
                              f"SIGCONT {p.name}: it wakes up, unaware that its lease ran out")

    def next_deadline(self):
        heads = [h[0][0] for h in (self.later, self.timers, self.wakeups) if h]
        return min(heads) if heads else None

    def finished(self):
        return (len(self.acked) == len(self.jobs) and not self.ready and not self.later
                and not self.frozen
                and all(p.busy is None for p in self.procs.values()))

    # ---- messages from workers
    def receive(self, p):
        try:
            message = p.pipe.recv()
        except (EOFError, OSError):
            return self.worker_gone(p)
        if message[0] == "ready":
            p.ready = True
        elif message[0] == "event":
            self.event(p, message[1])
        elif message[0] == "done":
            _, no, verdict, delay = message
            d, p.busy = p.busy, None
            d.settled = True
            if verdict == "ack":
                self.ack(d)
            else:
                self.count["nacks"] += 1
                self.publish(d.job, "retry after nack", delay)

    def ack(self, d):
        job_id = d.job["job_id"]
        if job_id in self.acked:
            return
        self.acked.add(job_id)
        if job_id in self.frozen:  # the job is done without the frozen worker: wake it
            heapq.heappush(self.wakeups, (time.monotonic() + 0.3, next(self.seq), job_id))
        if len(self.acked) % 50 == 0:
            self.say.note(f"-- {len(self.acked)}/{len(self.jobs)} jobs acked after "
                          f"{self.count['deliveries']} deliveries --")

    def worker_gone(self, p):
        p.process.join(2)
        code = p.process.exitcode
        how = "killed by SIGKILL" if code == -signal.SIGKILL else f"exited with status {code}"
        del self.procs[p.name]
        self.count["workers_lost"] += 1
        if self.count["workers_lost"] > 3 * WORKERS:
            raise RuntimeError(f"workers keep dying (last: {p.name}, {how})")
        key = p.busy.job["key"] if p.busy else ""
        name = self.spawn()
        self.say.line("broker", key, f"{p.name} is gone ({how}); its delivery stays unacked; "
                      f"starting {name}")

    def event(self, p, ev):
        job = self.jobs[ev["job_id"]]
        key, kind, fault = job["key"], ev["kind"], job["fault"]
        routine = None if fault else kind
        self.count[kind] += 1
        line = lambda text, routine=routine: self.say.line(p.name, key, text, routine)
        via = f"{VIA[p.busy.reason]} #{ev['nth']}" if p.busy else f"delivery #{ev['nth']}"

        if kind == "claim":
            prev = self.open_claim.get(job["job_id"])
            if prev and prev[0] != ev["token"]:
                self.count["takeovers"] += 1
                line(f"claimed again after {prev[1]}'s lease expired: takeover with token "
                     f"{ev['token']} (was {prev[0]}), attempt {ev['attempt']}", None)
            elif ev["pattern"] == "two-phase":
                line(f"claimed (token {ev['token']}, attempt {ev['attempt']}, lease "
                     f"{ev['lease']}s): calling the card provider")
            if ev["pattern"] == "two-phase":
                self.open_claim[job["job_id"]] = (ev["token"], p.name)
            if fault == "killed" and ev["nth"] == 1:
                os.kill(p.process.pid, signal.SIGKILL)
                self.count["kills"] += 1
                self.say.line("broker", key, f"SIGKILL {p.name} while it holds the claim "
                              f"(token {ev['token']}, lease {ev['lease']}s)")
            if fault == "frozen" and ev["nth"] == 1:
                os.kill(p.process.pid, signal.SIGSTOP)
                self.frozen[job["job_id"]] = p
                heapq.heappush(self.wakeups, (time.monotonic() + 5.0, next(self.seq),
                                              job["job_id"]))
                self.say.line("broker", key, f"SIGSTOP {p.name} mid-call (a long GC pause, a "
                              f"network partition): it holds token {ev['token']}")
        elif kind == "charged":
            self.settle_claim(job, ev["token"])
            held = f"token {ev['token']}" + (f", attempt {ev['attempt']}" if ev["attempt"] > 1 else "")
            if ev["pattern"] == "in-tx":
                text = (f"BEGIN; claim ({held}); charge {money(job['amount_cents'])}"
                        f" -> #{ev['charge_id']}; complete; COMMIT; ack")
            else:
                text = (f"BEGIN; charge {money(job['amount_cents'])} -> #{ev['charge_id']}; "
                        f"complete ({held}); COMMIT; ack")
            line(text)
        elif kind == "replay":
            concurrent = p.busy is not None and p.busy.reason in ("first", "duplicate")
            waited = (f"claim waited {ev['waited'] * 1000:.0f} ms for the other transaction, "
                      "then " if concurrent and ev["waited"] > 0.004 else "")
            line(f"{via}: {waited}completed -> replays charge "
                 f"#{ev['result']['charge_id']}, no second charge")
        elif kind == "in_progress":
            # retry_after is NULL when another transaction is creating the
            # key right now: there is no lease to tell of yet.
            if ev["retry_after"] is None:
                left = "another transaction is creating the key"
            else:
                left = f"the holder should be done in {ev['retry_after']:.2f}s"
            line(f"{via}: in_progress, {left} -> nack, retry in {ev['delay']:.2f}s")
        elif kind == "retry_later":
            concurrent = p.busy is not None and p.busy.reason in ("first", "duplicate")
            waited = ("after waiting for the other transaction, "
                      if concurrent and ev["waited"] > 0.004 else "")
            left = ("" if ev["retry_after"] is None
                    else f", {ev['retry_after'] * 1000:.0f} ms of backoff left")
            line(f"{via}: {waited}retry_later{left} -> nack")
        elif kind == "failed_retryable":
            self.settle_claim(job, ev["token"])
            line(f"attempt {ev['attempt']} failed ({ev['error']}) -> idem_fail(retryable) -> "
                 f"FAILED_RETRYABLE; nack")
        elif kind == "failed_final":
            self.settle_claim(job, ev["token"])
            why = "attempts exhausted" if ev["exhausted"] else "idem_fail(retryable => false)"
            line(f"attempt {ev['attempt']} failed ({ev['error']}) -> {why} -> FAILED_FINAL; "
                 f"no charge, dead-lettered", None)
        elif kind == "already_failed":
            line(f"{via}: failed ({ev['error']}) -> ack, nothing to do")
        elif kind == "heartbeat":
            line(f"slow provider: {ev['beats']} x idem_heartbeat kept the {ev['lease']}s lease alive")
        elif kind == "crash":
            line(f"COMMIT done (charge #{ev['charge_id']}) ... and the worker dies before it acks")
        elif kind == "fenced":
            self.fenced_tokens.append(ev["token"])
            line(f"late worker is back with token {ev['token']}: {ev['call']} raised "
                 f"{ev['sqlstate']} (stale token) -> ROLLBACK; its charge is undone, ack", None)
        elif kind == "error":
            line(f"UNEXPECTED ERROR: {ev['error']}", None)

    def settle_claim(self, job, token):
        if self.open_claim.get(job["job_id"], (None,))[0] == token:
            del self.open_claim[job["job_id"]]

    # ---- the run
    def run(self):
        for _ in range(WORKERS):
            self.spawn()
        deadline = time.monotonic() + RUN_LIMIT
        while not self.finished():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scenario did not finish within {RUN_LIMIT}s "
                                   f"({len(self.acked)}/{len(self.jobs)} jobs acked)")
            self.tick()
            self.dispatch()
            nxt = self.next_deadline()
            timeout = 0.05 if nxt is None else min(0.05, max(0.0, nxt - time.monotonic()))
            by_pipe = {p.pipe: p for p in self.procs.values()}
            for pipe in wait_for_pipes(list(by_pipe), timeout):
                if by_pipe[pipe].name in self.procs:
                    self.receive(by_pipe[pipe])
        for p in self.procs.values():
            p.pipe.send(None)
        for p in self.procs.values():
            p.process.join(5)

    def stop_all(self):
        for p in self.procs.values():
            if p.process.is_alive():
                p.process.kill()  # SIGKILL also ends a stopped process
            p.process.join(2)


# --------------------------------------------------------------------------
# Set-up, plan, report and proof.

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP TABLE IF EXISTS charges, jobs;
CREATE TABLE jobs (
    job_id       int PRIMARY KEY,
    key          text NOT NULL UNIQUE,     -- the idempotency key: one per job, stable
    customer     text NOT NULL,
    amount_cents int NOT NULL,
    method       text NOT NULL,            -- wallet (in-transaction) or card (two-phase)
    fault        text,                     -- what the simulated world does to it
    meant_to     text NOT NULL             -- 'charge' or 'fail': the plan, for the proof
);
-- No unique constraint on job_id, on purpose: nothing but the extension
-- stops a duplicate delivery from charging twice.
CREATE TABLE charges (
    charge_id    bigserial PRIMARY KEY,
    job_id       int NOT NULL REFERENCES jobs,
    customer     text NOT NULL,
    amount_cents int NOT NULL,
    provider_ref text,
    worker       text NOT NULL,
    token        bigint NOT NULL,          -- the fencing token the charge was made under
    charged_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

PROOF = """
WITH per_job AS (
    SELECT j.job_id, j.amount_cents, j.meant_to, k.status::text AS status,
           (k.result->>'charge_id')::bigint AS result_charge,
           (SELECT count(*) FROM charges c WHERE c.job_id = j.job_id) AS charges,
           (SELECT min(c.charge_id) FROM charges c WHERE c.job_id = j.job_id) AS charge_id,
           (SELECT min(c.token) FROM charges c WHERE c.job_id = j.job_id) AS charge_token,
           k.token AS key_token
      FROM jobs j
      LEFT JOIN LATERAL idempotency.idem_get(j.key, %(scope)s) k ON true)
SELECT count(*) FILTER (WHERE meant_to = 'charge'),
       count(*) FILTER (WHERE meant_to = 'charge' AND charges = 1),
       count(*) FILTER (WHERE meant_to = 'fail'),
       count(*) FILTER (WHERE meant_to = 'fail' AND charges = 0),
       (SELECT coalesce(sum(amount_cents), 0) FROM charges),
       coalesce(sum(amount_cents) FILTER (WHERE meant_to = 'charge'), 0),
       count(*),
       count(*) FILTER (WHERE status = CASE meant_to WHEN 'charge' THEN 'COMPLETED'
                                                   ELSE 'FAILED_FINAL' END),
       count(*) FILTER (WHERE meant_to = 'charge' AND result_charge = charge_id),
       count(*) FILTER (WHERE meant_to = 'charge' AND charge_token = key_token),
       (SELECT count(*) FROM charges),
       (SELECT count(*) FROM charges WHERE token = ANY (%(fenced)s)),
       (SELECT string_agg(status || ':' || n, ' ') FROM
           (SELECT coalesce(status, 'missing') AS status, count(*) AS n
              FROM per_job GROUP BY 1 ORDER BY 1) s)
  FROM per_job
"""


def plan_jobs(rng):
    jobs = []
    for i in range(1, JOBS + 1):
        jobs.append(dict(job_id=i, key=f"charge-{i:04d}", customer=f"cus_{rng.randrange(1, 80):03d}",
                         amount_cents=rng.randrange(199, 25000),
                         method="card" if rng.random() < 0.3 else "wallet", fault=None))
    # Faults land on distinct jobs, away from the very start of the stream.
    pools = {"card": [j for j in jobs[20:] if j["method"] == "card"],
             "wallet": [j for j in jobs[20:] if j["method"] == "wallet"]}
    for pool in pools.values():
        rng.shuffle(pool)
    for fault, (method, n, _) in FAULTS.items():
        for k in range(n):
            m = method or ("card" if k % 3 == 0 else "wallet")
            pools[m].pop()["fault"] = fault
    for j in jobs:
        j["meant_to"] = "fail" if j["fault"] in MEANT_TO_FAIL else "charge"
    return jobs


def plan_deliveries(broker, jobs, rng):
    """First deliveries in order; duplicates right behind (so two workers get
    the same job at the same moment) or a little later."""
    plan = Counter()
    for j in jobs:
        broker.publish(j, "first")
        if j["fault"] == "declined":  # a duplicate of a dead letter: answered `failed`
            broker.publish(j, "late duplicate", 1.0)
            plan["late"] += 1
        if j["fault"]:
            continue
        if rng.random() < 0.20:
            copies = 2 if rng.random() < 0.15 else 1
            for _ in range(copies):
                broker.publish(j, "duplicate")
            plan["concurrent"] += 1
            plan["triple"] += copies == 2
        if rng.random() < 0.08:
            broker.publish(j, "late duplicate", rng.uniform(0.3, 2.0))
            plan["late"] += 1
    return plan


def setup(dsn, jobs):
    db = psycopg2.connect(application_name="demo-setup", **dsn)
    db.autocommit = True
    cur = db.cursor()
    cur.execute(SCHEMA)
    cur.executemany("INSERT INTO jobs VALUES (%(job_id)s, %(key)s, %(customer)s, %(amount_cents)s,"
                    " %(method)s, %(fault)s, %(meant_to)s)", jobs)
    db.close()


def report(dsn, broker, elapsed):
    c = broker.count
    db = psycopg2.connect(application_name="demo-proof", **dsn)
    db.autocommit = True
    cur = db.cursor()
    fenced = broker.fenced_tokens
    cur.execute(PROOF, {"scope": SCOPE, "fenced": fenced})
    (should_charge, charged_once, should_fail, fail_uncharged, total_charged, total_expected,
     n_jobs, in_final_state, results_match, tokens_match, charge_rows, fenced_charges,
     states) = cur.fetchone()
    cur.execute("SELECT received, processing, completed, failed_retryable, failed_final, stuck"
                "  FROM idempotency.idem_stats WHERE scope = %s", (SCOPE,))
    stats = cur.fetchone()
    metrics = None
    cur.execute("SELECT to_regclass('idempotency.idem_metrics') IS NOT NULL")
    if cur.fetchone()[0]:
        try:
            cur.execute("SELECT claims, replays, in_progress, completions, failures_retryable,"
                        " failures_final, lease_expirations, stale_tokens"
                        "  FROM idempotency.idem_metrics")
            metrics = cur.fetchone()
        except psycopg2.Error:
            metrics = None
    db.close()

    wallet = sum(1 for j in broker.jobs.values() if j["method"] == "wallet")
    rows = [
        ("jobs", len(broker.jobs), f"{wallet} wallet (in-transaction), "
                                   f"{len(broker.jobs) - wallet} card (two-phase)"),
        ("deliveries", c["deliveries"],
         f"{c['deliveries:first']} first, {c['deliveries:duplicate']} concurrent duplicates, "
         f"{c['deliveries:late duplicate']} late duplicates,"),
        ("", None, f"{c['deliveries:visibility timeout']} after a visibility timeout, "
                   f"{c['deliveries:retry after nack']} retries after a nack"),
        ("claims granted", c["claim"], "idem_claim -> claimed (committed)"),
        ("replays (completed)", c["replay"], "duplicates answered with the stored result"),
        ("in_progress answers", c["in_progress"], "someone else held a live lease"),
        ("retry_later answers", c["retry_later"], "backoff after a failure not over yet"),
        ("retryable failures", c["failed_retryable"], "idem_fail(retryable), claimed again later"),
        ("takeovers", c["takeovers"], "expired lease, key claimed with a new token"),
        ("fenced late workers", c["fenced"], "IK001 stale token; their charge rolled back"),
        ("final failures", c["failed_final"], "FAILED_FINAL: declined, or attempts exhausted"),
        ("failed answers", c["already_failed"], "duplicates of a dead letter answered `failed`"),
        ("workers lost", c["workers_lost"],
         f"{c['crash']} crashed after COMMIT before ack, {c['kills']} SIGKILLed mid-work"),
        ("charges written", charge_rows, f"total {money(total_charged)}"),
        ("unexpected errors", c["error"], ""),
    ]
    print()
    print(f"== Report ({elapsed:.1f}s) " + "=" * 58)
    for label, value, note in rows:
        number = "" if value is None else str(value)
        print(f"  {label:<22}{number:>6}   {note}")
    if stats:
        print(f"  idem_stats             received={stats[0]} processing={stats[1]} "
              f"completed={stats[2]} failed_retryable={stats[3]} failed_final={stats[4]} "
              f"stuck={stats[5]}")
    if metrics:
        names = ("claims", "replays", "in_progress", "completions", "failures_retryable",
                 "failures_final", "lease_expirations", "stale_tokens")
        print("  idem_metrics           " + " ".join(f"{n}={v}" for n, v in zip(names, metrics)))

    checks = [
        (charged_once == should_charge,
         "every job meant to succeed has exactly one charge row", f"{charged_once} of {should_charge}"),
        (fail_uncharged == should_fail,
         "every job that failed for good has no charge", f"{fail_uncharged} of {should_fail}"),
        (total_charged == total_expected,
         "total charged = sum of those jobs' amounts",
         f"{money(total_charged)} = {money(total_expected)}"),
        (in_final_state == n_jobs,
         "every key COMPLETED (FAILED_FINAL where meant to fail)", states),
        (results_match == should_charge,
         "each stored result names the job's one charge", f"{results_match} of {should_charge}"),
        (tokens_match == should_charge,
         "each charge was made under the key's final fencing token",
         f"{tokens_match} of {should_charge}"),
        (fenced_charges == 0, "no charge survives from a fenced late worker",
         f"tokens {', '.join(map(str, fenced)) or 'none'}: {fenced_charges} rows"),
        (charge_rows == should_charge, "no stray charge rows", f"{charge_rows} rows"),
        (c["error"] == 0, "no unexpected errors in the workers", f"{c['error']}"),
    ]
    print("== Proof (SQL over jobs, charges and idem_get) " + "=" * 30)
    for ok, what, detail in checks:
        print(f"  {'[ok]  ' if ok else '[FAIL]'} {what:<57} {detail}")
    coverage = [
        ("duplicates replayed", c["replay"] > 0), ("in_progress answers", c["in_progress"] > 0),
        ("retries after backoff", c["failed_retryable"] > 0), ("takeovers", c["takeovers"] > 0),
        ("fenced late worker", c["fenced"] > 0), ("crash after COMMIT", c["crash"] > 0),
        ("final failures", c["failed_final"] > 0)]
    missing = [name for name, seen in coverage if not seen]
    if missing:
        print(f"  (note: this run did not exercise: {', '.join(missing)})")
    passed = all(ok for ok, _, _ in checks)
    print("PROOF HOLDS: every job took effect exactly once." if passed else
          "PROOF FAILED: see the [FAIL] lines above.")
    return passed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", required=True, help="the cluster's socket folder")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dbname", default="postgres")
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="print every delivery and event")
    args = parser.parse_args()
    dsn = dict(host=args.host, port=args.port, dbname=args.dbname, user=args.user)

    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)  # run.sh's clean-up sends TERM on Ctrl-C or failure

    rng = random.Random(args.seed)
    jobs = plan_jobs(rng)
    narrator = Narrator(args.verbose)
    broker = Broker(jobs, dsn, narrator)
    plan = plan_deliveries(broker, jobs, rng)

    print(f"{JOBS} 'charge customer' jobs, delivered at least once to {WORKERS} worker processes "
          f"(seed {args.seed})")
    print("  wallet charges: BEGIN; idem_claim; INSERT charge; idem_complete; COMMIT")
    print(f"  card charges:   idem_claim (lease {CARD_LEASE}s); call the provider; "
          "BEGIN; INSERT charge; idem_complete; COMMIT")
    print(f"  the broker: visibility timeout {VISIBILITY_TIMEOUT}s; {plan['concurrent']} jobs "
          f"delivered twice at once ({plan['triple']} of them three times), {plan['late']} "
          "duplicated later")
    print(f"  workers SET {', '.join(f'{k} = {v!r}' for k, v in SESSION_SETTINGS.items())}")
    print("  faults:")
    for j in jobs:
        if j["fault"]:
            print(f"    {j['key']} ({j['method']}): {FAULTS[j['fault']][2]}")
    print("  (routine lines: the first 3 of each kind; every line about a faulty job)\n")

    passed = False
    started = time.monotonic()
    try:
        setup(dsn, jobs)
        broker.run()
        passed = report(dsn, broker, time.monotonic() - started)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:
        print(f"\nDEMO FAILED: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        broker.stop_all()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
