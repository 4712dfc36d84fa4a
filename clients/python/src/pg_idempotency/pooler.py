"""Connections through a pooler in transaction mode (PgBouncer and the like).

There each transaction may run on another server backend, shared with other
clients, so a statement psycopg prepares on one (it does after
``prepare_threshold`` runs of a query) is missing on the next, or already
there for the next client: "prepared statement ... does not exist" or
"... already exists". A pooler gives its client a backend key of its own,
not the server backend's pid; where the two differ, the connections this
package opens prepare nothing, the outbox consumers do not LISTEN (a
notification would reach whichever client holds that backend; they poll),
and a claim's ``wait`` polls instead of waiting in the server (where it
would hold one of the pool's server connections).
A pool the application passes in is its own to configure
(``prepare_threshold=None`` in its connections' kwargs).
"""

import weakref

import psycopg

_BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"
_seen = weakref.WeakKeyDictionary()     # connection -> behind a pooler


def behind_pooler(conn):
    """Whether ``conn`` reaches the server through a pooler; asked of the
    server once per connection, which is left idle as it was found."""
    pooled = _seen.get(conn)
    if pooled is None:
        server_pid = conn.execute(_BACKEND_PID).fetchone()[0]
        if not conn.autocommit:
            conn.rollback()
        pooled = _seen[conn] = server_pid != conn.info.backend_pid
    return pooled


async def abehind_pooler(conn):
    """The same for an ``AsyncConnection``."""
    pooled = _seen.get(conn)
    if pooled is None:
        server_pid = (await (await conn.execute(_BACKEND_PID)).fetchone())[0]
        if not conn.autocommit:
            await conn.rollback()
        pooled = _seen[conn] = server_pid != conn.info.backend_pid
    return pooled


def unprepared_behind_pooler(conn):
    """Turns off psycopg's prepared statements on ``conn`` when it reaches
    the server through a pooler, and says whether it does."""
    pooled = behind_pooler(conn)
    if pooled:
        conn.prepare_threshold = None
    return pooled


async def aunprepared_behind_pooler(conn):
    """The same for an ``AsyncConnection``."""
    pooled = await abehind_pooler(conn)
    if pooled:
        conn.prepare_threshold = None
    return pooled


def connect(conninfo, **kwargs):
    """The package's own connection in autocommit, unprepared behind a
    pooler: ``(conn, pooled)``. ``kwargs`` go to psycopg.connect
    (application_name, ...)."""
    conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
    try:
        return conn, unprepared_behind_pooler(conn)
    except BaseException:
        conn.close()
        raise


async def aconnect(conninfo, **kwargs):
    """The same with an ``AsyncConnection``."""
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
    try:
        return conn, await aunprepared_behind_pooler(conn)
    except BaseException:
        await conn.close()
        raise


def with_unprepared(configure):
    """A pool's ``configure`` that runs unprepared_behind_pooler, then the
    application's own ``configure`` when it gave one."""
    def both(conn):
        unprepared_behind_pooler(conn)
        if configure is not None:
            configure(conn)
    return both


def awith_unprepared(configure):
    """The same for an ``AsyncConnectionPool``."""
    async def both(conn):
        await aunprepared_behind_pooler(conn)
        if configure is not None:
            await configure(conn)
    return both
