"""idem_maintenance() on an interval. The SQL edition has no background
workers: one call of ``idempotency.idem_maintenance()`` is one pass of
their sweeps (lease expiry, settling, purges). Where pg_cron is not
available, a process that runs anyway makes the calls: a thread with
``start_maintenance``, an asyncio task with ``astart_maintenance``. The
role needs EXECUTE on the function (grant_admin, or a GRANT of that one
function). Against the C++ extension a pass finds what its workers left."""

import asyncio
import logging
import math
import threading

from . import _sql
from .pooler import aconnect, connect

_log = logging.getLogger("pg_idempotency")


def _check(source, interval):
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
            or not math.isfinite(interval) or interval <= 0:
        raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
    if not isinstance(source, str) and not hasattr(source, "connection"):
        raise TypeError("start_maintenance needs a conninfo string or a connection pool")


def _report(on_error, error):
    """A failure is told, never raised: the next pass is still made."""
    try:
        if on_error is None:
            _log.warning("idem_maintenance failed: %s", error)
        else:
            on_error(error)
    except Exception:
        _log.exception("on_error failed")


def _passed(on_pass, on_error, rows):
    if on_pass is not None:
        try:
            on_pass(dict(rows))
        except Exception as exc:
            _report(on_error, exc)


class Maintenance:
    """The thread of ``start_maintenance``. ``stop()`` ends it once a
    running pass is over; it is a context manager that stops on exit."""

    def __init__(self, source, interval, on_pass, on_error):
        self.source, self.interval, self.on_pass, self.on_error = source, interval, on_pass, on_error
        self._conn = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idem_maintenance", daemon=True)
        self._thread.start()

    def stop(self, timeout=None):
        self._stopping.set()
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def _run(self):
        try:
            while True:
                self._pass()
                if self._stopping.wait(self.interval):
                    return
        finally:
            if self._conn is not None:
                self._conn.close()

    def _pass(self):
        try:
            if isinstance(self.source, str):
                rows = self._own_connection().execute(_sql.MAINTENANCE).fetchall()
            else:
                with self.source.connection() as conn:
                    rows = conn.execute(_sql.MAINTENANCE).fetchall()
        except Exception as exc:
            if self._conn is not None and self._conn.broken:
                self._conn.close()
                self._conn = None
            _report(self.on_error, exc)
            return
        _passed(self.on_pass, self.on_error, rows)

    def _own_connection(self):
        if self._conn is None or self._conn.closed:
            self._conn, _ = connect(self.source, application_name="idem_maintenance")
        return self._conn


def start_maintenance(source, *, interval=5.0, on_pass=None, on_error=None):
    """Calls idem_maintenance() on a daemon thread, at once and then
    ``interval`` seconds after the end of each pass. ``source``: a conninfo
    string (one connection of its own, opened again after it broke) or a
    ``psycopg_pool.ConnectionPool``. ``on_pass({task: rows})`` hears each
    pass, ``on_error(exc)`` each failure (default: a warning on the
    ``pg_idempotency`` logger); the next pass is made either way."""
    _check(source, interval)
    return Maintenance(source, interval, on_pass, on_error)


class AsyncMaintenance:
    """The task of ``astart_maintenance``. ``await stop()`` ends it once a
    running pass is over; ``async with`` stops it on exit."""

    def __init__(self, source, interval, on_pass, on_error):
        self.source, self.interval, self.on_pass, self.on_error = source, interval, on_pass, on_error
        self._conn = None
        self._stopping = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self):
        self._stopping.set()
        await asyncio.wait({self._task})

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.stop()

    async def _run(self):
        try:
            while True:
                await self._pass()
                try:
                    await asyncio.wait_for(self._stopping.wait(), self.interval)
                    return
                except asyncio.TimeoutError:
                    pass
        finally:
            if self._conn is not None:
                await self._conn.close()

    async def _pass(self):
        try:
            if isinstance(self.source, str):
                conn = await self._own_connection()
                rows = await (await conn.execute(_sql.MAINTENANCE)).fetchall()
            else:
                async with self.source.connection() as conn:
                    rows = await (await conn.execute(_sql.MAINTENANCE)).fetchall()
        except Exception as exc:
            if self._conn is not None and self._conn.broken:
                await self._conn.close()
                self._conn = None
            _report(self.on_error, exc)
            return
        _passed(self.on_pass, self.on_error, rows)

    async def _own_connection(self):
        if self._conn is None or self._conn.closed:
            self._conn, _ = await aconnect(self.source, application_name="idem_maintenance")
        return self._conn


def astart_maintenance(source, *, interval=5.0, on_pass=None, on_error=None):
    """``start_maintenance`` for asyncio, from a running event loop: the
    passes run in a task. ``source``: a conninfo string or a
    ``psycopg_pool.AsyncConnectionPool``."""
    _check(source, interval)
    return AsyncMaintenance(source, interval, on_pass, on_error)
