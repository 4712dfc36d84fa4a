"""The worker pattern for asyncio: ``async with aclaim(aconn, key, ...)``
behaves as ``claim`` (see claim.py), with the heartbeat in a task."""

import asyncio
from contextlib import asynccontextmanager

import psycopg
from psycopg import pq

from . import _sql
from ._state import JobState, dict_cursor, exit_action
from .errors import is_stale_token


async def _connect_like(conn):
    password = conn.info.password
    return await psycopg.AsyncConnection.connect(
        conn.info.dsn, autocommit=True, **({"password": password} if password else {}))


async def keep_alive(job, renew):
    """Awaits renew() every third of the lease until cancelled. IK001 or
    IK003 means the lease is lost: job.lost is set and it ends. Other
    errors (a dropped connection) are transient; the next beat retries."""
    while True:
        await asyncio.sleep(job.lease / 3)
        try:
            await renew()
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) in ("IK001", "IK003"):
                job.lost.set()
                return


async def heartbeat(job, connect):
    """keep_alive on a connection of its own, opened by connect()."""
    conn = None

    async def renew():
        nonlocal conn
        if conn is None or conn.closed:
            conn = await connect()
        await conn.execute(_sql.HEARTBEAT, job.params())
    try:
        await keep_alive(job, renew)
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
        async with self.conn.transaction():
            await self.conn.execute(_sql.COMPLETE, self.params(result=_sql.jsonb(result)))
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

    async def _fail(self, exc):
        async with self.conn.transaction():
            cur = dict_cursor(self.conn)
            status = (await (await cur.execute(_sql.FAIL, self.failure(exc))).fetchone())["status"]
            due = await (await cur.execute(_sql.NEXT_ATTEMPT, self.params())).fetchone()
        self.failed(status, due and due["retry_after"], exc)


class aclaim:
    """``async with aclaim(aconn, key, request=None, *, scope='default',
    lease=30, wait=None, heartbeat=True, classify=None, reraise=False,
    connect=None) as job``; ``connect`` is a coroutine function."""

    def __init__(self, conn, key, request=None, *, scope="default", lease=30, wait=None,
                 heartbeat=True, classify=None, reraise=False, connect=None):
        self.job = AsyncJob(conn, key, request, scope, lease, classify)
        self.wait = wait
        self.reraise = reraise
        self.in_transaction = conn.info.transaction_status != pq.TransactionStatus.IDLE
        self.heartbeat = heartbeat and not self.in_transaction
        self.connect = connect or (lambda: _connect_like(conn))
        self.beat = None

    async def __aenter__(self):
        job = self.job
        async with job.conn.transaction():
            cur = await dict_cursor(job.conn).execute(_sql.CLAIM, job.claim_params(self.wait))
            job.answered(await cur.fetchone())
        if job.claimed and self.heartbeat:
            self.beat = asyncio.create_task(heartbeat(job, self.connect))
        return job

    async def __aexit__(self, exc_type, exc, tb):
        job = self.job
        if self.beat is not None:
            self.beat.cancel()
            await asyncio.gather(self.beat, return_exceptions=True)
        action = exit_action(job, exc, self.in_transaction)
        try:
            if action == "complete":
                await job.complete(job.result)
            elif action == "fail":
                await job._fail(exc)
            elif action == "fence":
                job.fenced(exc)
        except psycopg.Error as recording_error:
            if not is_stale_token(recording_error):
                raise
            job.fenced(recording_error)
        return action in ("fail", "fence") and not self.reraise
