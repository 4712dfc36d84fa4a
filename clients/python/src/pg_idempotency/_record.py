"""Recording how work ended outlives a brief loss of the database (a
restart, a dropped connection): a record lost that way would leave the key
held until its lease ends, and its work would run again. The middlewares,
which record on a pool, try again when a try fails without an answer from
the server: 0.1 s later and then twice as long each time up to 1 s, for at
most 10 s, or until the claim's lease ends when that is later, as its
heartbeat moves it on (until then the key is the claim's to record, and a
record given up leaves it to run again). The wait for a pool connection
counts in that time. A try whose answer was lost may have committed: the
next one then finds the key no longer PROCESSING (IK003), and the key
itself says whether this claim's record is the one it holds. A middleware's
claim is tried again too (claim_tried_again), so that a request after a
restart is not answered 500 by a connection the restart closed; in the
transaction and register modes, the key's transaction is, until its
handler starts."""

import asyncio
import time

import psycopg

from . import _sql

PATIENCE = 10.0

# How long the heartbeat keeps a record trying at most (unless the lease the
# claim set at the record's start ends later): a try that keeps failing as a
# lost connection while the beats still get through must not hold the
# caller for ever.
MOST_PATIENCE = 60.0

# The states of a key that each record leaves.
_RECORDED = {_sql.COMPLETE: ("COMPLETED",), _sql.FAIL: ("FAILED_RETRYABLE", "FAILED_FINAL")}

KEY_RECORD = "SELECT status::text, token FROM idempotency.idem_get(%(key)s, %(scope)s)"


def lost_connection(exc):
    """The statement may not have reached the server, or its answer did not
    come back: a connection error without a SQLSTATE (the network, a closed
    connection, no connection from the pool in time), or a connection
    failure or a server shutting down."""
    code = getattr(exc, "sqlstate", None)
    if code is None:
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return code.startswith("08") or code in ("57P01", "57P02", "57P03")


def _connection(pool, timeout):
    """A connection of ``pool`` within ``timeout`` seconds (a pool of another
    kind, without the argument: within its own)."""
    try:
        return pool.connection(timeout=timeout)
    except TypeError:
        return pool.connection()


class _ClaimTries:
    """The schedule of a middleware claim's tries after a lost connection:
    at once, then 0.05 s and twice as long each time up to 1 s, for at most
    PATIENCE seconds. A database restart leaves the pool's idle connections
    closed, and each would fail a request at once: the pool checks them
    (psycopg_pool's ``check``) before the first new try. A claim whose
    answer was lost may have been made: tried again, it answers in_progress,
    never a second claim."""

    def __init__(self, pool):
        self.check = getattr(pool, "check", None)
        self.end, self.pause = time.monotonic() + PATIENCE, 0.0

    def after(self, exc):
        """(check the pool first?, the pause before the next try), or None
        to give up (raise exc)."""
        left = self.end - time.monotonic()
        if not lost_connection(exc) or left <= 0:
            return None
        first, pause = self.pause == 0.0, min(self.pause, left)
        self.pause = min(max(self.pause * 2, 0.05), 1.0)
        return first and self.check is not None, pause


def claim_tried_again(pool, run):
    """``run()``, a claim on a connection of ``pool`` (or the key's
    transaction, raising only before its handler starts), tried again after
    a lost connection (_ClaimTries)."""
    tries = _ClaimTries(pool)
    while True:
        try:
            return run()
        except psycopg.Error as exc:
            next_try = tries.after(exc)
            if next_try is None:
                raise
        check, pause = next_try
        if check:
            tries.check()
        time.sleep(pause)


async def aclaim_tried_again(pool, run):
    """``claim_tried_again`` on an AsyncConnectionPool."""
    tries = _ClaimTries(pool)
    while True:
        try:
            return await run()
        except psycopg.Error as exc:
            next_try = tries.after(exc)
            if next_try is None:
                raise
        check, pause = next_try
        if check:
            await tries.check()
        await asyncio.sleep(pause)


class _Tries:
    """The schedule of the tries, and what a lost answer means."""

    def __init__(self, job, sql):
        self.job, self.statuses = job, _RECORDED[sql]
        start = time.monotonic()
        self.least = start + PATIENCE
        self.most = max(start + MOST_PATIENCE, job.lease_ends)
        self.pause, self.lost = 0.1, False

    @property
    def deadline(self):
        """Read again at each try: a heartbeat still running moves the
        lease on, and a record waiting for a busy pool while the lease lasts
        is not given up, for up to MOST_PATIENCE or the lease it started
        with."""
        return max(self.least, min(self.job.lease_ends, self.most))

    def left(self):
        return max(0.1, self.deadline - time.monotonic())

    def holds_record(self, row):
        return row is not None and row[0] in self.statuses and row[1] == self.job.token

    def next_pause(self, exc):
        """The pause before the next try, or None to give up (raise exc)."""
        left = self.deadline - time.monotonic()
        if not lost_connection(exc) or left <= 0:
            return None
        self.lost = True
        pause, self.pause = min(self.pause, left), min(self.pause * 2, 1.0)
        return pause


def record(pool, job, sql, params):
    """Runs ``sql`` (COMPLETE or FAIL) on a connection of ``pool``, tried
    again after a lost connection."""
    tries = _Tries(job, sql)
    while True:
        try:
            with _connection(pool, tries.left()) as conn:
                conn.execute(sql, params)
            return
        except psycopg.Error as exc:
            if tries.lost and getattr(exc, "sqlstate", None) == "IK003":
                try:
                    with _connection(pool, tries.left()) as conn:
                        if tries.holds_record(conn.execute(KEY_RECORD, job.params()).fetchone()):
                            return
                except psycopg.Error:
                    pass
            pause = tries.next_pause(exc)
            if pause is None:
                raise
            time.sleep(pause)


async def arecord(pool, job, sql, params):
    """``record`` on an AsyncConnectionPool."""
    tries = _Tries(job, sql)
    while True:
        try:
            async with _connection(pool, tries.left()) as conn:
                await conn.execute(sql, params)
            return
        except psycopg.Error as exc:
            if tries.lost and getattr(exc, "sqlstate", None) == "IK003":
                try:
                    async with _connection(pool, tries.left()) as conn:
                        if tries.holds_record(await (await conn.execute(KEY_RECORD, job.params())).fetchone()):
                            return
                except psycopg.Error:
                    pass
            pause = tries.next_pause(exc)
            if pause is None:
                raise
            await asyncio.sleep(pause)
