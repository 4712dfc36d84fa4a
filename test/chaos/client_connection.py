"""The connection the chaos test's step workers give the Python client
(clients/python, on psycopg 3): the client runs its calls as usual, and the
connection holds the fence (see chaoslib) for them.

Every transaction takes the fence in shared mode right before its first
statement that calls the extension, and keeps it to its end, as the
psycopg2 processes do by hand: a step's own writes (a reservation row) come
first, so that a restart can cut its transaction with the row written. An
extension call outside a transaction could not hold the fence and is
refused: the step workers run every call in one."""

import time
from contextlib import contextmanager

import psycopg
from psycopg.pq import TransactionStatus

from chaoslib import FENCE_SQL


class FencedCursor(psycopg.Cursor):
    def execute(self, query, params=None, **options):
        conn = self.connection
        if isinstance(query, str) and "idempotency." in query and not conn.fence_held:
            if conn.info.transaction_status != TransactionStatus.INTRANS:
                raise RuntimeError("an extension call outside a transaction cannot hold the fence")
            super().execute(FENCE_SQL)
            conn.fence_held = True
        return super().execute(query, params, **options)


class FencedConnection(psycopg.Connection):
    fence_held = False

    @contextmanager
    def transaction(self, savepoint_name=None, force_rollback=False):
        if self.info.transaction_status == TransactionStatus.IDLE:
            self.fence_held = False     # a new transaction: the fence is not held yet
        with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx


def connect(dsn, application_name, stop=lambda: False):
    """An autocommit FencedConnection, retried with backoff while the
    server is away (restarting, in recovery). None once stop() is true."""
    delay = 0.05
    while not stop():
        try:
            conn = FencedConnection.connect(dsn, autocommit=True, application_name=application_name,
                                            connect_timeout=3)
            conn.cursor_factory = FencedCursor
            return conn
        except psycopg.OperationalError:
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    return None


def connection_lost(error, conn):
    """True when error means the connection is gone (a restart, a crash):
    psycopg 3 raises OperationalError for a closed server connection."""
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)):
        return True
    if conn is not None and conn.closed:
        return True
    code = getattr(error, "sqlstate", None)
    if code is None:
        return type(error) is psycopg.DatabaseError
    return code.startswith("08") or code.startswith("57P")
