"""The worker pattern for asyncio: ``async with aclaim(aconn, key, ...)``
behaves as ``claim`` (see claim.py), with the heartbeat in a task."""

import asyncio
import contextlib
from contextlib import asynccontextmanager

import psycopg
from psycopg import pq

from . import _sql
from ._state import JobState, dict_cursor, exit_action, refused_result, result_param
from ._steps import AsyncStep, StepHolder, arun_step
from ._options import seconds
from .errors import NotClaimed, UnstorableResult, is_stale_token
from .hooks import Hooks
from .pooler import abehind_pooler
from .waiting import aasked_again, apoll

# How long stop_beat waits for a heartbeat task after its stop flag is set.
STOP_WAIT = 5.0


async def _connect_like(conn):
    password = conn.info.password
    return await psycopg.AsyncConnection.connect(
        conn.info.dsn, autocommit=True, prepare_threshold=conn.prepare_threshold,
        **({"password": password} if password else {}))


async def keep_alive(job, renew, stopping):
    """Awaits renew() every third of the lease until ``stopping`` (an
    asyncio.Event) is set. IK001 or IK003 means the lease is lost: job.lost
    is set and it ends. Other errors (a dropped connection, a pool that
    timed out) are transient; the next beat retries. The flag, not a
    cancellation, is what stops it: a cancel that lands while a pool hands
    out a connection can be lost (psycopg_pool 3.1), the flag cannot."""
    period = job.lease / 3
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), period)
            return
        except asyncio.TimeoutError:
            pass
        if stopping.is_set():
            return
        try:
            await asyncio.wait_for(renew(), period)
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) in ("IK001", "IK003"):
                if not job.recording:   # else the record says what happened
                    job.lost.set()
                return
            if type(exc).__name__ == "PoolClosed":
                return
            # anything else (a dropped connection, a pool's timeout) is
            # transient: the next beat retries
        except (asyncio.TimeoutError, OSError):
            pass


def start_beat(job, renew):
    """Starts keep_alive in a task; returns (task, stop flag)."""
    stopping = asyncio.Event()
    return asyncio.create_task(keep_alive(job, renew, stopping)), stopping


async def stop_beat(beat, stopping, wait=STOP_WAIT):
    """Stops a heartbeat task within ``wait`` seconds: sets its flag, cancels
    it (more than once if a cancel is swallowed) and waits for it, never
    longer than ``wait``. A task still running after that ends at the flag
    once its renew returns. Raises only a cancellation of its caller."""
    stopping.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while not beat.done():
        beat.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            await asyncio.wait({beat}, timeout=min(0.5, left))
        except asyncio.CancelledError:
            stopping.set()
            raise
    if beat.done() and not beat.cancelled():
        beat.exception()    # retrieved: a failed beat is not an error of the job


async def heartbeat(job, connect, stopping):
    """keep_alive on a connection of its own, opened by connect()."""
    conn = None

    async def renew():
        nonlocal conn
        if conn is None or conn.closed:
            conn = await connect()
        await conn.execute(_sql.HEARTBEAT, job.params())
    try:
        await keep_alive(job, renew, stopping)
    finally:
        if conn is not None:
            await conn.close()


class AsyncJob(JobState):
    """A claim on a psycopg AsyncConnection."""

    def __init__(self, conn, key, request, scope, lease, classify):
        super().__init__(key, request, scope, lease, classify)
        self.conn = conn
        self.lost = asyncio.Event()

    async def fence(self):
        await self.conn.execute(_sql.ASSERT_OWNER, self.params())

    async def complete(self, result=None):
        param = result_param(result)
        try:
            async with self.conn.transaction():
                await self.conn.execute(_sql.COMPLETE, self.params(result=param))
        except psycopg.DataError as exc:    # 22xxx: its result (the claim took the rest)
            raise refused_result(exc) from exc
        self.completed(result)

    @asynccontextmanager
    async def transaction(self):
        async with self.conn.transaction():
            await self.fence()
            yield self.conn

    async def release(self):
        async with self.conn.transaction():
            await self.conn.execute(_sql.RELEASE, self.params())
        self.outcome = self.finished = "released"

    def step(self, name, fn=None):
        """A step of multi-step work (see ``Job.step``): ``await
        job.step(name, afn)`` awaits ``afn(step)`` unless the step finished
        before, or ``async with job.step(name) as s``."""
        holder = StepHolder(self.key, self.token, self.scope, self.attempt, self.steps,
                            lambda: contextlib.nullcontext(self.conn))
        return AsyncStep(holder, name) if fn is None else arun_step(holder, name, fn)

    async def _fail(self, exc):
        async with self.conn.transaction():
            cur = dict_cursor(self.conn)
            status = (await (await cur.execute(_sql.FAIL, self.failure(exc))).fetchone())["status"]
            due = await (await cur.execute(_sql.NEXT_ATTEMPT, self.params())).fetchone()
        self.failed(status, due and due["retry_after"], exc)


class aclaim:
    """``async with aclaim(aconn, key, request=None, *, scope='default',
    lease=30, wait=None, heartbeat=True, classify=None, reraise=False,
    connect=None, on_replay=None, on_conflict=None, on_fenced=None) as job``;
    ``connect`` is a coroutine function. Entering raises ``NotClaimed``
    unless the key is claimed."""

    def __init__(self, conn, key, request=None, *, scope="default", lease=30, wait=None,
                 heartbeat=True, classify=None, reraise=False, connect=None,
                 on_replay=None, on_conflict=None, on_fenced=None):
        self.job = AsyncJob(conn, key, request, scope, seconds("lease", lease, 30, positive=True), classify)
        self.hooks = Hooks(on_replay, on_conflict, on_fenced)
        self.stopping = None
        self.wait = seconds("wait", wait, None)
        self.reraise = reraise
        self.in_transaction = conn.info.transaction_status != pq.TransactionStatus.IDLE
        self.heartbeat = heartbeat and not self.in_transaction
        self.connect = connect or (lambda: _connect_like(conn))
        self.beat = None

    async def __aenter__(self):
        job = self.job
        job.answered(await self._claim())
        if not job.claimed:
            self.hooks.answered(job)
            raise NotClaimed(job)
        if self.heartbeat:
            self.stopping = asyncio.Event()
            self.beat = asyncio.create_task(heartbeat(job, self.connect, self.stopping))
        return job

    async def _claim(self):
        """The claim's answer: as ``claim._claim``."""
        job = self.job

        async def attempt(wait=None):
            async with job.conn.transaction():
                cur = await dict_cursor(job.conn).execute(_sql.CLAIM, job.claim_params(wait))
                return await cur.fetchone()

        if (self.wait or 0) > 0 and not self.in_transaction and await abehind_pooler(job.conn):
            return await apoll(attempt, self.wait)
        if (self.wait or 0) > 0 and not self.in_transaction:
            return await aasked_again(attempt, self.wait)
        return await attempt(self.wait)

    async def __aexit__(self, exc_type, exc, tb):
        job = self.job
        if self.beat is not None:
            await stop_beat(self.beat, self.stopping)
        action = exit_action(job, exc, self.in_transaction)
        try:
            if action == "complete":
                try:
                    await job.complete(job.result)
                except UnstorableResult as unstorable:
                    # Left held, the key would run its work again once the
                    # lease ended, to the same end: it fails for good.
                    await job._fail(unstorable)
            elif action == "fail":
                await job._fail(exc)
            elif action == "fence":
                job.fenced(exc)
        except psycopg.Error as recording_error:
            if not is_stale_token(recording_error):
                raise
            job.fenced(recording_error)
        if job.outcome == "fenced":
            self.hooks.fenced(job)
        return action in ("fail", "fence") and not self.reraise


async def arun_once(conn, key, work, request=None, **options):
    """``run_once`` for asyncio: awaits ``work(job)`` only if the key is
    claimed; returns the job either way."""
    try:
        async with aclaim(conn, key, request, **options) as job:
            value = await work(job)
            if job.finished is None:
                job.result = value
    except NotClaimed as answer:
        return answer.job
    return job
