"""The Idempotency-Key middleware for threaded servers, independent of the
framework: ``pg_idempotency.wsgi`` (and with it ``pg_idempotency.flask``)
and ``pg_idempotency.django`` are thin adapters over ``SyncIdempotency``.
The behaviour is the ASGI middleware's (see pg_idempotency.asgi), in the
modes 'claim' and 'transaction', on a ``psycopg_pool.ConnectionPool``;
the heartbeat of claim mode is a thread, stopped by a flag."""

import contextlib
import json
import threading
import time

import psycopg
from psycopg.rows import dict_row

from . import _record, _sql
from ._beat_lane import lane_of
from ._options import flag, function, header_name, pool_of, scope_name, seconds
from ._options import methods as check_methods, paths as check_paths
from ._state import JobState
from ._steps import StepHolder, SyncStep, run_step
from .asgi import IdempotencyContext
from .hooks import Hooks
from .pooler import with_unprepared
from .errors import MAX_RETRY_IN, classify_or, error_text
from .http import (NOT_UTF8, TOO_LARGE, answer, default_classify, default_fingerprint, encode_response, problem,
                   header_text, response_builders, unrecorded)
from .waiting import ThreadOwners, answered_row

_MODES = ("claim", "transaction")
_SAVEPOINT = "idempotent_handler"


class SyncContext(IdempotencyContext):
    """What the handler finds (``request.environ['idempotency']`` with
    Flask, ``request.idempotency`` with Django): key, request, scope, token,
    attempt, conn (transaction mode: a psycopg Connection in the key's
    transaction), lost (a threading.Event, claim mode), fence(conn), and for
    multi-step handlers steps, step(name, fn) and step_key(name)."""

    def fence(self, conn):
        conn.execute(_sql.ASSERT_OWNER, {"key": self.key, "token": self.token, "scope": self.scope})

    def step(self, name, fn=None):
        """A step of a multi-step handler, as ``Job.step``: in claim mode in
        a transaction of its own on a connection of the pool, so that a
        retry of a failed request resumes after the steps that finished; in
        transaction mode on ``conn``, committed with everything else."""
        holder = StepHolder(self.key, self.token, self.scope, self.attempt, self.steps, self.connection,
                            self._note_unstorable)
        return SyncStep(holder, name) if fn is None else run_step(holder, name, fn)


class _Beat(threading.Thread):
    """Renews the lease every third of it until its flag is set."""

    def __init__(self, job, renew):
        super().__init__(name=f"heartbeat {job.key}", daemon=True)
        self.job, self.renew, self.stopping = job, renew, threading.Event()

    def run(self):
        while not self.stopping.wait(self.job.lease / 3):
            try:
                self.renew()
            except psycopg.Error as exc:
                if getattr(exc, "sqlstate", None) in ("IK001", "IK003"):
                    if not self.job.recording:   # else the record says what happened
                        self.job.lost.set()
                    return
                if type(exc).__name__ == "PoolClosed":
                    return

    def stop(self):
        self.stopping.set()
        self.join(min(5.0, max(1.0, self.job.lease / 3)))


class _AppFailed(Exception):
    def __init__(self, error):
        super().__init__(error)
        self.error = error


class SyncIdempotency:
    """``SyncIdempotency(*, pool=None, conninfo=None, scope='default',
    mode='claim', required=True, methods=('POST', 'PATCH'),
    header='Idempotency-Key', replay_header='Idempotent-Replayed', lease=30,
    wait=0, retry_in=0, fingerprint=default_fingerprint,
    classify=default_classify, completed_response=None, failed_response=None,
    expired_response=None, paths=None, on_replay=None, on_conflict=None,
    on_fenced=None, pool_options=None)``. ``expired_response(key)``: the
    answer to a duplicate of a key whose stored response has expired (only
    its tombstone is left); default ``http.expired_problem``, a 410. With ``conninfo`` it opens a
    ``psycopg_pool.ConnectionPool`` at the first request (``pool_options``:
    its arguments, such as ``max_size``); ``close()`` closes it."""

    def __init__(self, *, pool=None, conninfo=None, scope="default", mode="claim", required=True,
                 methods=("POST", "PATCH"), header="Idempotency-Key", replay_header="Idempotent-Replayed",
                 lease=30, wait=0, retry_in=0, fingerprint=default_fingerprint, classify=default_classify,
                 completed_response=None, failed_response=None, expired_response=None, paths=None,
                 on_replay=None, on_conflict=None, on_fenced=None, pool_options=None):
        if pool is None and conninfo is None:
            raise TypeError("the Idempotency-Key middleware needs a pool or a conninfo")
        if mode not in _MODES:
            raise ValueError(f"unknown mode {mode!r} (threaded servers: 'claim' or 'transaction')")
        self._pool, self.conninfo, self.pool_options = pool_of(pool), conninfo, dict(pool_options or {})
        self.pool_lock = threading.Lock()
        self.scope, self.mode, self.required = scope_name(scope), mode, flag("required", required)
        self.methods = check_methods(methods)
        self.header = header_name("header", header)
        self.replay_header = header_name("replay_header", replay_header).lower()
        self.lease = seconds("lease", lease, 30, positive=True)
        self.wait = seconds("wait", wait, 0)
        self.retry_in = seconds("retry_in", retry_in, None, most=MAX_RETRY_IN)   # None: the extension's backoff
        self.fingerprint = function("fingerprint", fingerprint) or default_fingerprint
        self.classify = function("classify", classify) or default_classify
        self.completed_response, self.failed_response, self.expired_response = response_builders(
            completed_response, failed_response, expired_response)
        self.paths = check_paths(paths)
        self.hooks = Hooks(on_replay, on_conflict, on_fenced)
        self.owners = ThreadOwners()

    def pool(self):
        if self._pool is None:
            with self.pool_lock:
                if self._pool is None:
                    from psycopg_pool import ConnectionPool
                    options = {"min_size": 1, "max_size": 10, **self.pool_options}
                    kwargs = {"autocommit": True, **options.pop("kwargs", {})}
                    options["configure"] = with_unprepared(options.get("configure"))
                    self._pool = ConnectionPool(self.conninfo, kwargs=kwargs, **options)
        return self._pool

    def close(self):
        if self._pool is not None and self.conninfo is not None:
            self._pool.close()
            self._pool = None

    def covers(self, method, path):
        return method.upper() in self.methods and (not self.paths or path.startswith(self.paths))

    def handle(self, method, path, key, body, content_type, call):
        """The response to a covered request; ``call(context)`` runs the
        app and returns its ``pg_idempotency.http.Response`` (``context`` is
        None for a request without a key that is let through)."""
        key = header_text(key or "")
        if key is None:
            return problem(400, *NOT_UTF8)
        if not key:
            if not self.required:
                return call(None)
            return problem(400, "Idempotency-Key is missing", "This request requires an Idempotency-Key header.")
        if len(key.encode()) > 255:
            return problem(400, "Idempotency-Key is too long", "At most 255 bytes.")
        request = self.fingerprint(method, path, body, content_type)
        context = SyncContext(key=key, request=request, scope=self.scope)
        http = {"method": method, "path": path}
        run = self._run_claimed if self.mode == "claim" else self._run_in_transaction
        return run(context, call, http)

    def _claim_once(self, job, conn=None):
        if conn is not None:
            return conn.cursor(row_factory=dict_row).execute(_sql.CLAIM, job.claim_params(None)).fetchone()
        pool = self.pool()

        def claim():
            with pool.connection() as c:
                return c.cursor(row_factory=dict_row).execute(_sql.CLAIM, job.claim_params(None)).fetchone()
        return _record.claim_tried_again(pool, claim)

    def _answer(self, row, job, http):
        response = answer(row, self.completed_response, self.failed_response, self.replay_header,
                          key=job.key, expired_response=self.expired_response)
        job.answered(row)
        self.hooks.answered(job, status=response.status, **http)
        return response

    def _run_claimed(self, context, call, http):
        pool = self.pool()
        job = JobState(context.key, context.request, self.scope, self.lease, None)
        row = self.owners.claim(lambda: self._claim_once(job), job, self.wait)
        if row["outcome"] != "claimed":
            return self._answer(row, job, http)
        job.answered(row)
        job.lost = threading.Event()
        context.token, context.attempt, context.lost = job.token, job.attempt, job.lost
        context.steps, context.connection = job.steps, pool.connection

        def record(sql, **params):
            _record.record(pool, job, sql, job.params(**params))

        lane = lane_of(pool)

        def renew():   # a lost beat: the next one tries again
            started = time.monotonic()
            lane.beat(job.params())
            job.renewed(started)
        done = self.owners.hold(job)
        published = None        # what the duplicates waiting in this process are answered
        beat = _Beat(job, renew)
        lane.acquire()
        beat.start()
        try:
            # The heartbeat goes on while the outcome is recorded: a record
            # that waits for a busy pool must not let the lease end, or a
            # duplicate takes the key over and runs the handler again.
            try:
                response = call(context)
            except BaseException as exc:
                job.recording = True
                try:
                    record(_sql.FAIL, error=error_text(exc), retryable=not context.unstorable, retry_in=self.retry_in)
                except psycopg.Error:
                    pass    # taken over, or the database is gone: the lease ends it
                beat.stop()
                raise
            job.recording = True
            kind = "final" if context.unstorable else classify_or(self.classify, default_classify, response)
            stored = encode_response(response)
            try:
                if kind == "complete":
                    record(_sql.COMPLETE, result=_sql.jsonb(stored))
                    published = answered_row(job, "completed", result=stored)
                else:
                    final = kind == "final"
                    error = json.dumps(stored, separators=(",", ":")) if final else f"HTTP {response.status}"
                    record(_sql.FAIL, error=error, retryable=not final, retry_in=None if final else self.retry_in)
                    published = answered_row(job, "failed", error=error) if final else None
            except psycopg.Error as exc:
                # 22001: larger than the server stores: left held, the key
                # would run the handler again at each lease's end, so it
                # fails for good and this client gets what a retry will.
                if getattr(exc, "sqlstate", None) == "22001":
                    try:
                        record(_sql.FAIL, error=TOO_LARGE, retryable=False, retry_in=None)
                        published = answered_row(job, "failed", error=TOO_LARGE)
                        response = self.failed_response(TOO_LARGE)
                    except psycopg.Error as again:
                        response = unrecorded(job.key, again)
                elif getattr(exc, "sqlstate", None) != "IK001":
                    response = unrecorded(job.key, exc)
                else:
                    job.fenced(exc)
                    self.hooks.fenced(job, status=response.status, **http)
            beat.stop()
        finally:
            beat.stopping.set()
            lane.release()
            self.owners.release(job, done, published)
        return response

    def _run_in_transaction(self, context, call, http):
        pool = self.pool()
        job = JobState(context.key, context.request, self.scope, self.lease, None)
        ran = {}

        def once():
            handler_started = False
            with pool.connection() as conn:
                try:
                    with conn.transaction() as tx:
                        row = self._claim_once(job, conn)
                        if row["outcome"] != "claimed":
                            return row
                        ran["done"] = self.owners.hold(job)
                        conn.execute(f"SAVEPOINT {_SAVEPOINT}")   # a final answer rolls back to it
                        handler_started = True
                        ran["response"], keep = self._handle_in(conn, row, job, context, call)
                        if not keep:
                            raise psycopg.Rollback(tx)
                except _AppFailed as failed:
                    raise failed.error
                except psycopg.Error as exc:
                    # Before the handler nothing ran and nothing committed:
                    # raised, to be tried again on a fresh connection. After
                    # it, its writes were lost with the transaction, and it
                    # must not run twice in one request: a retryable 500.
                    if not handler_started:
                        raise
                    ran["response"] = unrecorded(job.key, exc)
                finally:
                    if "done" in ran:
                        self.owners.release(job, ran.pop("done"))
            return row

        def attempt():
            try:
                return _record.claim_tried_again(pool, once)
            except psycopg.Error as exc:
                ran["response"] = unrecorded(job.key, exc)
                return {"outcome": "error"}     # what the wait is told when the database failed

        row = self.owners.claim(attempt, job, self.wait)
        return ran.get("response") or self._answer(row, job, http)

    def _handle_in(self, conn, row, job, context, call):
        job.answered(row)
        context.token, context.attempt, context.conn = job.token, job.attempt, conn
        context.steps, context.connection = job.steps, lambda: contextlib.nullcontext(conn)
        try:
            response = call(context)
        except Exception as exc:
            raise _AppFailed(exc) from exc
        kind = "final" if context.unstorable else classify_or(self.classify, default_classify, response)
        if kind == "retryable":
            return response, False
        if kind == "final":
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            conn.execute(_sql.FAIL, job.params(error=json.dumps(encode_response(response), separators=(",", ":")),
                                               retryable=False, retry_in=None))
        else:
            conn.execute(_sql.COMPLETE, job.params(result=_sql.jsonb(encode_response(response))))
        return response, True
