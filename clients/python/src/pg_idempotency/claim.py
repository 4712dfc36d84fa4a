"""The worker pattern, synchronous: claim a key, run the block while a
heartbeat thread keeps the lease, and record how the block ended.

    with idem.claim(conn, key, request, scope="invoice.email") as job:
        message_id = send(...)                  # the external effect
        with job.transaction():                 # fence, writes, complete
            conn.execute("UPDATE invoices ...")
            job.complete({"message_id": message_id})

The block runs only when the key is claimed: otherwise entering it raises
``NotClaimed`` (its ``job`` holds the answer: a replayed result, 'in
progress' with ``retry_after``...). ``run_once(conn, key, work, request)``
runs ``work(job)`` only when claimed and returns the job either way.

Leaving the block normally completes the key with ``job.result`` unless the
block completed or released it. An exception fails the key (retryable or
final, see ``classify``) and is kept in ``job.exception`` instead of
propagating (``reraise=True`` lets it through); IK001 (the lease was lost
and the key taken over) ends the job as 'fenced'.

Called inside a transaction of the caller, the claim joins it (Pattern 1:
claim, business writes and complete commit together): no heartbeat then,
and exceptions propagate, since the caller's rollback undoes the claim.
"""

import contextlib
import functools
import threading
from contextlib import contextmanager

import psycopg
from psycopg import pq

from . import _sql
from ._state import JobState, dict_cursor, exit_action, refused_result, result_param
from ._steps import StepHolder, SyncStep, run_step
from ._options import seconds
from .errors import NotClaimed, UnstorableResult, is_stale_token
from .hooks import Hooks
from .pooler import behind_pooler
from .waiting import asked_again, poll

# How long stopping waits for the heartbeat (it stops by itself at its next
# beat whatever happens to this wait).
STOP_WAIT = 5.0


def _connect_like(conn):
    """A new connection with the settings of ``conn``, for the heartbeat
    (preparing nothing where ``conn`` prepares nothing: a pooler)."""
    password = conn.info.password
    return psycopg.connect(conn.info.dsn, autocommit=True, prepare_threshold=conn.prepare_threshold,
                           **({"password": password} if password else {}))


class Heartbeat(threading.Thread):
    """Renews the lease every third of it on a connection of its own. IK001
    or IK003 means the lease is lost: ``job.lost`` is set and it stops."""

    def __init__(self, job, connect):
        super().__init__(name=f"heartbeat {job.key}", daemon=True)
        self.job = job
        self.connect = connect
        self.stopping = threading.Event()

    def run(self):
        conn = None
        try:
            while not self.stopping.wait(self.job.lease / 3):
                try:
                    conn = conn or self.connect()
                    if self.stopping.is_set():
                        return
                    conn.execute(_sql.HEARTBEAT, self.job.params())
                except psycopg.Error as exc:
                    if getattr(exc, "sqlstate", None) in ("IK001", "IK003"):
                        self.job.lost.set()
                        return
                    if conn is not None and conn.closed:
                        conn = None     # reconnect at the next beat
        finally:
            if conn is not None:
                conn.close()

    def stop(self):
        """Sets the stop flag and waits a bounded time: a beat in flight may
        still be blocked on the network; it ends at the flag once it returns."""
        self.stopping.set()
        self.join(min(STOP_WAIT, max(1.0, self.job.lease / 3)))


class Job(JobState):
    """A claim on a synchronous psycopg connection."""

    def __init__(self, conn, key, request, scope, lease, classify):
        super().__init__(key, request, scope, lease, classify)
        self.conn = conn
        self.lost = threading.Event()

    def fence(self):
        """IK001 unless this job still holds the key; the key's row stays
        locked until the current transaction ends."""
        self.conn.execute(_sql.ASSERT_OWNER, self.params())

    def complete(self, result=None):
        """Stores the result: inside the current transaction if there is
        one (after the business writes), else in a transaction of its own.
        UnstorableResult (a FinalError) for a result that cannot be stored."""
        param = result_param(result)
        try:
            with self.conn.transaction():
                self.conn.execute(_sql.COMPLETE, self.params(result=param))
        except psycopg.DataError as exc:    # 22xxx: its result (the claim took the rest)
            raise refused_result(exc) from exc
        self.completed(result)

    @contextmanager
    def transaction(self):
        """A transaction that starts with the fence: the business writes in
        it and ``complete()`` commit together, or not at all."""
        with self.conn.transaction():
            self.fence()
            yield self.conn

    def release(self):
        """Gives the key back without counting an attempt."""
        with self.conn.transaction():
            self.conn.execute(_sql.RELEASE, self.params())
        self.outcome = self.finished = "released"

    def step(self, name, fn=None):
        """A step of multi-step work. ``job.step(name, fn)`` returns the
        stored result when the step finished before, else runs ``fn(step)``
        in a transaction on the job's connection and records the step in it
        (``step.key``: the key for the step's external call; ``step.conn``:
        the connection whose writes commit with the record). Without ``fn``,
        a context manager: ``with job.step(name) as s`` (the block runs
        either way: when ``s.done`` it finished before and ``s.result`` is
        its result; else set ``s.result``)."""
        holder = StepHolder(self.key, self.token, self.scope, self.attempt, self.steps,
                            lambda: contextlib.nullcontext(self.conn))
        return SyncStep(holder, name) if fn is None else run_step(holder, name, fn)

    def _fail(self, exc):
        with self.conn.transaction():
            cur = dict_cursor(self.conn)
            status = cur.execute(_sql.FAIL, self.failure(exc)).fetchone()["status"]
            due = cur.execute(_sql.NEXT_ATTEMPT, self.params()).fetchone()
        self.failed(status, due and due["retry_after"], exc)


class claim:
    """``with claim(conn, key, request=None, *, scope='default', lease=30,
    wait=None, heartbeat=True, classify=None, reraise=False, connect=None,
    on_replay=None, on_conflict=None, on_fenced=None) as job``. ``connect()``
    opens the heartbeat's connection (default: one like ``conn``). Entering
    raises ``NotClaimed`` unless the key is claimed."""

    def __init__(self, conn, key, request=None, *, scope="default", lease=30, wait=None,
                 heartbeat=True, classify=None, reraise=False, connect=None,
                 on_replay=None, on_conflict=None, on_fenced=None):
        self.job = Job(conn, key, request, scope, seconds("lease", lease, 30, positive=True), classify)
        self.hooks = Hooks(on_replay, on_conflict, on_fenced)
        self.wait = seconds("wait", wait, None)
        self.reraise = reraise
        self.in_transaction = conn.info.transaction_status != pq.TransactionStatus.IDLE
        self.heartbeat = heartbeat and not self.in_transaction
        self.connect = connect or functools.partial(_connect_like, conn)
        self.beat = None

    def __enter__(self):
        job = self.job
        job.answered(self._claim())
        if not job.claimed:
            self.hooks.answered(job)
            raise NotClaimed(job)
        if self.heartbeat:
            self.beat = Heartbeat(job, self.connect)
            self.beat.start()
        return job

    def _claim(self):
        """The claim's answer. Its wait is the server's, except on a
        connection through a pooler outside a transaction of the caller:
        there it polls (waiting.poll), so that no server connection of the
        pool is held while the key's holder needs one to complete. Outside
        a transaction of the caller, a wait that the holder's commit fails
        under REPEATABLE READ is asked again (waiting.asked_again)."""
        job = self.job

        def attempt(wait=None):
            with job.conn.transaction():
                return dict_cursor(job.conn).execute(_sql.CLAIM, job.claim_params(wait)).fetchone()

        if (self.wait or 0) > 0 and not self.in_transaction and behind_pooler(job.conn):
            return poll(attempt, self.wait)
        if (self.wait or 0) > 0 and not self.in_transaction:
            return asked_again(attempt, self.wait)
        return attempt(self.wait)

    def __exit__(self, exc_type, exc, tb):
        job = self.job
        if self.beat is not None:
            self.beat.stop()
        action = exit_action(job, exc, self.in_transaction)
        try:
            if action == "complete":
                try:
                    job.complete(job.result)
                except UnstorableResult as unstorable:
                    # Left held, the key would run its work again once the
                    # lease ended, to the same end: it fails for good.
                    job._fail(unstorable)
            elif action == "fail":
                job._fail(exc)
            elif action == "fence":
                job.fenced(exc)
        except psycopg.Error as recording_error:
            if not is_stale_token(recording_error):
                raise
            job.fenced(recording_error)
        if job.outcome == "fenced":
            self.hooks.fenced(job)
        return action in ("fail", "fence") and not self.reraise


def run_once(conn, key, work, request=None, **options):
    """Runs ``work(job)`` under a claim of ``key`` only if the key is
    claimed; its return value is the result (unless ``work`` completed or
    released the key itself). Returns the job: for a duplicate, the claim's
    answer (``job.claimed`` False). Options as ``claim``."""
    try:
        with claim(conn, key, request, **options) as job:
            value = work(job)
            if job.finished is None:
                job.result = value
    except NotClaimed as answer:
        return answer.job
    return job


def idempotent(*, key, request=None, **options):
    """Decorator: ``fn(job, *args, **kwargs)`` runs under a claim of
    ``key(*args, **kwargs)`` (and ``request(*args, **kwargs)``, if given) on
    the connection passed first; its return value is the result. The
    decorated function takes ``(conn, *args, **kwargs)`` and returns the Job.
    """
    def decorate(fn):
        @functools.wraps(fn)
        def run(conn, *args, **kwargs):
            req = request(*args, **kwargs) if request else None
            return run_once(conn, key(*args, **kwargs), lambda job: fn(job, *args, **kwargs), req, **options)
        return run
    return decorate
