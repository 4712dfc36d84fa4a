"""Connections through a pooler in transaction mode (PgBouncer and the like).

There each transaction may run on another server backend, shared with other
clients, so a statement psycopg prepares on one (it does after
``prepare_threshold`` runs of a query) is missing on the next, or already
there for the next client: "prepared statement ... does not exist" or
"... already exists". A pooler gives its client a backend key of its own,
not the server backend's pid; where the two differ, the connections this
package opens prepare nothing, and the outbox consumers do not LISTEN (a
notification would reach whichever client holds that backend; they poll).
A pool the application passes in is its own to configure
(``prepare_threshold=None`` in its connections' kwargs).
"""

import psycopg

_BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"


def _unprepared_if(conn, server_pid):
    pooled = server_pid != conn.info.backend_pid
    if pooled:
        conn.prepare_threshold = None
    return pooled


def unprepared_behind_pooler(conn):
    """Turns off psycopg's prepared statements on ``conn`` when it reaches
    the server through a pooler, and says whether it does; leaves it idle as
    it found it."""
    server_pid = conn.execute(_BACKEND_PID).fetchone()[0]
    if not conn.autocommit:
        conn.rollback()
    return _unprepared_if(conn, server_pid)


async def aunprepared_behind_pooler(conn):
    """The same for an ``AsyncConnection``."""
    server_pid = (await (await conn.execute(_BACKEND_PID)).fetchone())[0]
    if not conn.autocommit:
        await conn.rollback()
    return _unprepared_if(conn, server_pid)


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
