"""ASGI middleware for the Idempotency-Key header (FastAPI, Starlette, any
ASGI app); the same behaviour as the Node.js middleware:

    no key, required              400
    in progress / retry later     409 with Retry-After (or wait up to `wait`)
    key reused, another request   422
    done                          the stored response, Idempotent-Replayed: true
    new                           the handler runs; its response is stored
                                  (or, failed, classified retryable or final)

Modes: 'claim' (the key is claimed and committed, the handler runs under a
heartbeat, its response is stored after it answers), 'transaction' (the
claim, the handler's writes on ``request.state.idempotency.conn`` and the
stored response commit together) and 'register' (the key is registered and
the handler, typically enqueueing a job on that connection and answering
202, commits with it; a worker claims and completes the key, and later
requests replay what it stored).

    app.add_middleware(IdempotencyMiddleware, conninfo="dbname=shop", scope="orders")
"""

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import psycopg

from . import _record, _sql
from ._beat_lane import alane_of
from ._options import flag, function, header_name, pool_of, scope_name, seconds
from ._options import methods as check_methods, paths as check_paths
from ._state import JobState, dict_cursor
from ._steps import AsyncStep, StepHolder, arun_step, step_key
from .aclaim import start_beat, stop_beat
from .hooks import Hooks
from .pooler import awith_unprepared
from .waiting import AsyncOwners, answered_row
from .errors import MAX_RETRY_IN, classify_or, error_text
from .http import (NOT_UTF8, TOO_LARGE, Response, answer, default_classify, default_fingerprint, encode_response,
                   header_text, problem, response_builders, unrecorded)

_MODES = ("claim", "transaction", "register")
_SAVEPOINT = "idempotent_handler"


@dataclass
class IdempotencyContext:
    """What the handler finds in ``request.state.idempotency``."""
    key: str
    request: Any                  # the fingerprint: pass it to the worker in register mode
    scope: str
    token: Optional[int] = None   # the claim's fencing token (claim and transaction modes)
    attempt: Optional[int] = None
    conn: Any = None              # the AsyncConnection of the key's transaction (transaction, register)
    lost: Optional[asyncio.Event] = None   # set when the lease is lost (claim mode)

    steps: dict = field(default_factory=dict)   # multi-step handlers: the steps finished so far
    # Where a step's transaction runs: a connection of the pool (claim mode)
    # or the key's transaction (transaction mode).
    connection: Any = field(default=None, repr=False)
    # A step's result could not be stored: the key fails for good (it
    # would at every attempt, after the step's work).
    unstorable: bool = field(default=False, repr=False)

    def _note_unstorable(self, exc):
        self.unstorable = True

    async def fence(self, conn):
        """Fences a transaction of the handler's own: IK001 once the key was taken over."""
        await conn.execute(_sql.ASSERT_OWNER, {"key": self.key, "token": self.token, "scope": self.scope})

    def step(self, name, fn=None):
        """A step of a multi-step handler, as ``AsyncJob.step``: in claim mode
        in a transaction of its own, so that a retry of a failed request
        resumes after the steps that finished; in transaction mode on
        ``conn``, committed with everything else; not in register mode."""
        holder = StepHolder(self.key, self.token, self.scope, self.attempt, self.steps, self.connection,
                            self._note_unstorable)
        return AsyncStep(holder, name) if fn is None else arun_step(holder, name, fn)

    def step_key(self, name):
        """The key of a step's external call (idem_step_key)."""
        return step_key(self.scope, self.key, name)


class _Recorder:
    """Takes the app's response messages instead of sending them."""

    def __init__(self):
        self.status = None
        self.headers = {}
        self.chunks = []
        self.done = False

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
            for name, value in message.get("headers", []):
                name, value = name.decode("latin-1").lower(), value.decode("latin-1")
                old = self.headers.get(name)
                self.headers[name] = value if old is None else (old if isinstance(old, list) else [old]) + [value]
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))
            self.done = not message.get("more_body", False)

    def response(self):
        if self.status is None or not self.done:
            return problem(500, "Internal error", "The handler did not complete its response.")
        return Response(self.status, self.headers, b"".join(self.chunks))


async def _read_body(receive):
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body, receive):
    """A receive() that gives the body read already, then the client's messages."""
    given = False

    async def replay():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


async def _send(send, response):
    headers = [(b"content-length", str(len(response.body)).encode())]
    for name, value in response.headers.items():
        if name.lower() == "content-length":
            continue
        for one in value if isinstance(value, list) else [value]:
            headers.append((name.encode("latin-1"), str(one).encode("latin-1")))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


class IdempotencyMiddleware:
    """``IdempotencyMiddleware(app, *, pool=None, conninfo=None, scope='default',
    mode='claim', required=True, methods=('POST', 'PATCH'), header='Idempotency-Key',
    replay_header='Idempotent-Replayed', lease=30, wait=0, retry_in=0,
    fingerprint=default_fingerprint, classify=default_classify,
    completed_response=None, failed_response=None, expired_response=None, paths=None,
    on_replay=None, on_conflict=None, on_fenced=None)``

    ``pool``: a psycopg_pool.AsyncConnectionPool (or ``conninfo``, and the
    middleware opens one, closed at the app's shutdown). ``paths``: only
    requests whose path starts with one of these take part (default: all).
    ``wait``: a duplicate waits up to this long for the holder, holding no
    pool connection while it waits (see pg_idempotency.waiting).
    """

    def __init__(self, app, *, pool=None, conninfo=None, scope="default", mode="claim", required=True,
                 methods=("POST", "PATCH"), header="Idempotency-Key", replay_header="Idempotent-Replayed",
                 lease=30, wait=0, retry_in=0, fingerprint=default_fingerprint, classify=default_classify,
                 completed_response=None, failed_response=None, expired_response=None, paths=None,
                 on_replay=None, on_conflict=None, on_fenced=None):
        if pool is None and conninfo is None:
            raise TypeError("IdempotencyMiddleware needs a pool or a conninfo")
        if mode not in _MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.app = app
        self.pool = pool_of(pool)
        self.conninfo = conninfo
        self.own_pool = pool is None
        self.pool_lock = asyncio.Lock()
        self.scope = scope_name(scope)
        self.mode = mode
        self.required = flag("required", required)
        self.methods = check_methods(methods)
        self.header = header_name("header", header).lower().encode("latin-1")
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
        self.owners = AsyncOwners()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" and self.own_pool:
            return await self.app(scope, receive, self._closing_on_shutdown(send))
        if scope["type"] != "http" or scope["method"] not in self.methods or (
                self.paths and not scope["path"].startswith(self.paths)):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        key = header_text(headers.get(self.header, b""))
        if key is None:
            return await _send(send, problem(400, *NOT_UTF8))
        if not key:
            if not self.required:
                return await self.app(scope, receive, send)
            return await _send(send, problem(400, "Idempotency-Key is missing",
                                             "This request requires an Idempotency-Key header."))
        if len(key.encode()) > 255:
            return await _send(send, problem(400, "Idempotency-Key is too long", "At most 255 bytes."))
        body = await _read_body(receive)
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        request = self.fingerprint(scope["method"], scope["path"], body, content_type)
        context = IdempotencyContext(key=key, request=request, scope=self.scope)
        scope = {**scope, "state": {**scope.get("state", {}), "idempotency": context}}
        run = self._run_claimed if self.mode == "claim" else self._run_in_transaction
        await run(context, scope, _replaying(body, receive), send)

    # ------------------------------------------------------------ the modes

    async def _claim_once(self, pool, job):
        async def claim():
            async with pool.connection() as conn:
                return await (await dict_cursor(conn).execute(_sql.CLAIM, job.claim_params(None))).fetchone()
        return await _record.aclaim_tried_again(pool, claim)

    async def _run_claimed(self, context, scope, receive, send):
        pool = await self._pool()
        job = JobState(context.key, context.request, self.scope, self.lease, None)
        row = await self.owners.claim(lambda: self._claim_once(pool, job), job, self.wait)
        if row["outcome"] != "claimed":
            return await _send(send, self._answer(row, job, scope))
        job.answered(row)
        context.token, context.attempt, context.lost = job.token, job.attempt, asyncio.Event()
        context.steps, context.connection = job.steps, pool.connection
        job.lost = context.lost

        async def record(sql, **params):
            await _record.arecord(pool, job, sql, job.params(**params))

        lane = alane_of(pool)

        async def renew():   # a lost beat: the next one tries again
            started = time.monotonic()
            await lane.beat(job.params())
            job.renewed(started)
        done = self.owners.hold(job)
        published = None        # what the duplicates waiting in this process are answered
        lane.acquire()
        beat, stopping = start_beat(job, renew)
        recorder = _Recorder()
        try:
            # The heartbeat goes on while the outcome is recorded: a record
            # that waits for a busy pool must not let the lease end, or a
            # duplicate takes the key over and runs the handler again.
            try:
                await self.app(scope, receive, recorder.send)
            except BaseException as exc:
                job.recording = True
                # Raised, or cancelled (a client gone, a server stopping):
                # a retryable failure, so that a retry runs at once. Bounded
                # and shielded: a second cancel cannot leave the key held.
                error = error_text(exc)
                try:
                    await asyncio.wait_for(asyncio.shield(record(
                        _sql.FAIL, error=error, retryable=not context.unstorable, retry_in=self.retry_in)), 5)
                except (psycopg.Error, asyncio.TimeoutError, asyncio.CancelledError):
                    pass    # taken over, or the database is gone: the lease ends it
                await stop_beat(beat, stopping)
                raise
            job.recording = True
            response = recorder.response()
            kind = "final" if context.unstorable else classify_or(self.classify, default_classify, response)
            stored = encode_response(response)
            try:
                if kind == "complete":
                    await record(_sql.COMPLETE, result=_sql.jsonb(stored))
                    published = answered_row(job, "completed", result=stored)
                else:
                    final = kind == "final"
                    error = _json_text(stored) if final else f"HTTP {response.status}"
                    await record(_sql.FAIL, error=error, retryable=not final, retry_in=None if final else self.retry_in)
                    published = answered_row(job, "failed", error=error) if final else None
            except psycopg.Error as exc:
                # IK001: the lease was lost and another request holds the key;
                # this response is still the truth about the work done here.
                # 22001: larger than the server stores: left held, the key
                # would run the handler again at each lease's end, so it
                # fails for good and this client gets what a retry will.
                if getattr(exc, "sqlstate", None) == "22001":
                    try:
                        await record(_sql.FAIL, error=TOO_LARGE, retryable=False, retry_in=None)
                        published = answered_row(job, "failed", error=TOO_LARGE)
                        response = self.failed_response(TOO_LARGE)
                    except psycopg.Error as again:
                        response = unrecorded(job.key, again)
                elif getattr(exc, "sqlstate", None) != "IK001":
                    response = unrecorded(job.key, exc)
                else:
                    job.fenced(exc)
                    self.hooks.fenced(job, **self._http(scope, response.status))
            await stop_beat(beat, stopping)
        finally:
            stopping.set()
            lane.release()
            self.owners.release(job, done, published)
        await _send(send, response)

    async def _run_in_transaction(self, context, scope, receive, send):
        pool = await self._pool()
        registering = self.mode == "register"
        job = JobState(context.key, context.request, self.scope, self.lease, None)
        ran = {}

        async def once():
            handler_started = False
            async with pool.connection() as conn:
                try:
                    async with conn.transaction() as tx:
                        cur = dict_cursor(conn)
                        sql = _sql.REGISTER if registering else _sql.CLAIM
                        row = await (await cur.execute(sql, job.claim_params(None))).fetchone()
                        if row["outcome"] not in ("claimed", "registered"):
                            return row
                        ran["done"] = self.owners.hold(job)
                        await conn.execute(f"SAVEPOINT {_SAVEPOINT}")   # a final answer rolls back to it
                        handler_started = True
                        ran["response"], keep = await self._handle_in(conn, row, job, context, scope, receive)
                        if not keep:
                            raise psycopg.Rollback(tx)  # as if the request never came; the response is sent
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

        async def attempt():
            try:
                return await _record.aclaim_tried_again(pool, once)
            except psycopg.Error as exc:
                ran["response"] = unrecorded(job.key, exc)
                return {"outcome": "error"}     # what the wait is told when the database failed

        row = await self.owners.claim(attempt, job, 0 if registering else self.wait)
        response = ran.get("response") or self._answer(row, job, scope)
        await _send(send, response)

    async def _handle_in(self, conn, row, job, context, scope, receive):
        """Runs the app inside the key's transaction; returns its response
        once the outcome is written, and whether the transaction is to be
        committed (else rolled back)."""
        registering = self.mode == "register"
        job.answered(row)
        context.token, context.attempt, context.conn = job.token, job.attempt, conn
        if not registering:
            context.steps, context.connection = job.steps, lambda: contextlib.nullcontext(conn)
        recorder = _Recorder()
        try:
            await self.app(scope, receive, recorder.send)
        except Exception as exc:
            raise _AppFailed(exc) from exc      # rolls everything back
        response = recorder.response()
        kind = "final" if context.unstorable else classify_or(self.classify, default_classify, response)
        if kind == "retryable" or (kind == "final" and registering):
            return response, False
        if kind == "final":
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            await conn.execute(_sql.FAIL, job.params(error=_json_text(encode_response(response)),
                                                     retryable=False, retry_in=None))
        elif not registering:
            await conn.execute(_sql.COMPLETE, job.params(result=_sql.jsonb(encode_response(response))))
        return response, True

    # ------------------------------------------------------------ helpers

    def _answer(self, row, job, scope):
        response = answer(row, self.completed_response, self.failed_response, self.replay_header,
                          key=job.key, expired_response=self.expired_response)
        job.answered(row)
        self.hooks.answered(job, **self._http(scope, response.status))
        return response

    @staticmethod
    def _http(scope, status):
        return {"method": scope["method"], "path": scope["path"], "status": status}

    async def _pool(self):
        if self.pool is None:
            async with self.pool_lock:
                if self.pool is None:
                    from psycopg_pool import AsyncConnectionPool
                    pool = AsyncConnectionPool(self.conninfo, open=False, kwargs={"autocommit": True},
                                               configure=awith_unprepared(None))
                    await pool.open()
                    self.pool = pool
        return self.pool

    def _closing_on_shutdown(self, send):
        async def closing(message):
            if message["type"] == "lifespan.shutdown.complete" and self.pool is not None:
                await self.pool.close()
                self.pool = None
            await send(message)
        return closing


def _json_text(value):
    return json.dumps(value, separators=(",", ":"))


class _AppFailed(Exception):
    """The app raised inside the key's transaction (re-raised once it rolled back)."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error
