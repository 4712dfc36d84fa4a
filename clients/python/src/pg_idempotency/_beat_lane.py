"""The heartbeats of a pool's claims (the middlewares' claim mode) go through
one connection of their own, opened with the pool's settings while a
heartbeat runs and closed with the last. Through the pool a beat waits
behind every request for a connection, and on a busy pool that wait
outlasted the lease: the key was taken over and its work ran twice. The
beats of one pool take turns on the connection (each is one short
statement). A pool that does not say how it connects (no ``conninfo``) is
beaten through."""

import asyncio
import threading
import weakref

import psycopg

from . import _sql
from .pooler import aconnect, connect

_lanes = weakref.WeakKeyDictionary()     # pool -> its lane
_lanes_lock = threading.Lock()


def _settings(pool):
    kwargs = dict(getattr(pool, "kwargs", None) or {})
    kwargs.pop("autocommit", None)      # the lane's connection is always in autocommit
    return pool.conninfo, kwargs


def _lane_of(pool, kind):
    if not isinstance(getattr(pool, "conninfo", None), str):
        return None
    with _lanes_lock:
        lane = _lanes.get(pool)
        if lane is None:
            lane = _lanes[pool] = kind(*_settings(pool))
        return lane


class BeatLane:
    """The lane of a ``psycopg_pool.ConnectionPool``, for threads."""

    def __init__(self, conninfo, kwargs):
        self.conninfo, self.kwargs = conninfo, kwargs
        self.users = 0
        self.conn = None
        self.state = threading.Lock()   # users
        self.busy = threading.Lock()    # the connection, one beat at a time

    def acquire(self):
        with self.state:
            self.users += 1

    def release(self):
        """The last user closes the connection, or leaves that to the beat
        in flight (which may be blocked on the network)."""
        with self.state:
            self.users -= 1
            if self.users > 0 or not self.busy.acquire(blocking=False):
                return
        try:
            self._drop()
        finally:
            self.busy.release()

    def beat(self, params):
        with self.busy:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn, _ = connect(self.conninfo, **self.kwargs)
                self.conn.execute(_sql.HEARTBEAT, params)
            except psycopg.Error:
                if self.conn is not None and self.conn.closed:
                    self.conn = None    # the next beat connects anew
                raise
            finally:
                with self.state:
                    idle = self.users == 0
                if idle:
                    self._drop()

    def _drop(self):
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class AsyncBeatLane:
    """The lane of a ``psycopg_pool.AsyncConnectionPool``, for tasks. A beat
    runs in a task of the lane's, which its caller's cancellation (the
    heartbeat's bound of a third of the lease) does not cut: a statement
    cut in flight would leave the connection unusable, and a new one per
    beat piles up behind a busy pooler. A claim's next beat, while its last
    is still in flight, waits for that one instead of queueing another."""

    def __init__(self, conninfo, kwargs):
        self.conninfo, self.kwargs = conninfo, kwargs
        self.users = 0
        self.conn = None
        self.busy = asyncio.Lock()
        self.in_flight = {}     # (scope, key, token) -> its beat's task
        self.closing = set()    # the close tasks of discarded connections

    def acquire(self):
        self.users += 1

    def release(self):
        self.users -= 1
        if self.users == 0 and not self.busy.locked():
            self._discard()

    async def beat(self, params):
        claim = (params["scope"], params["key"], params["token"])
        task = self.in_flight.get(claim)
        if task is None:
            task = self.in_flight[claim] = asyncio.get_running_loop().create_task(self._beat(params))
            task.add_done_callback(lambda done: self._finished(claim, done))
        await asyncio.shield(task)

    def _finished(self, claim, task):
        self.in_flight.pop(claim, None)
        if not task.cancelled():
            task.exception()    # retrieved: a caller that left no longer does

    async def _beat(self, params):
        async with self.busy:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn, _ = await aconnect(self.conninfo, **self.kwargs)
                await self.conn.execute(_sql.HEARTBEAT, params)
            except psycopg.Error:
                if self.conn is not None and self.conn.closed:
                    self.conn = None
                raise
            except BaseException:
                self._discard()     # cancelled in a statement (the loop ending): its state is unknown
                raise
            finally:
                if self.users == 0:
                    self._discard()

    def _discard(self):
        """Closes the connection in a task of its own: a cancelled beat
        cannot wait for it."""
        conn, self.conn = self.conn, None
        if conn is not None:
            task = asyncio.get_running_loop().create_task(conn.close())
            self.closing.add(task)
            task.add_done_callback(self.closing.discard)


class _ThroughPool:
    """The beats of a pool that does not say how it connects: through it."""

    def __init__(self, pool):
        self.pool = pool

    def acquire(self):
        pass

    def release(self):
        pass

    def beat(self, params):
        with self.pool.connection() as conn:
            conn.execute(_sql.HEARTBEAT, params)


class _AsyncThroughPool(_ThroughPool):
    async def beat(self, params):
        async with self.pool.connection() as conn:
            await conn.execute(_sql.HEARTBEAT, params)


def lane_of(pool):
    """Where the beats of a ConnectionPool's claims go: its lane."""
    return _lane_of(pool, BeatLane) or _ThroughPool(pool)


def alane_of(pool):
    """The same for an AsyncConnectionPool."""
    return _lane_of(pool, AsyncBeatLane) or _AsyncThroughPool(pool)
