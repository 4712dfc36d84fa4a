"""The transactional outbox: enqueue in the caller's transaction, and a
consumer loop for those who use the outbox as a job queue."""

import asyncio
import contextlib
import inspect
import os
import select
import sys

import psycopg

from . import _sql
from ._options import MAX_BATCH, count, seconds
from ._state import JobState, dict_cursor
from .errors import NotClaimed, classify_or, default_classify, error_text, is_stale_token, retry_in_or_none
from .hooks import Hooks
from .pooler import aconnect, connect


def _enqueue_params(topic, payload, key, headers, dedup_key, deliver_at):
    return {"topic": topic, "payload": _sql.jsonb(payload), "key": key, "headers": _sql.jsonb(headers),
            "dedup_key": dedup_key, "deliver_at": deliver_at}


def enqueue(conn, topic, payload, *, key=None, headers=None, dedup_key=None, deliver_at=None):
    """Enqueues on ``conn``, in its current transaction: the event exists if
    and only if that transaction commits. Returns the event id."""
    params = _enqueue_params(topic, payload, key, headers, dedup_key, deliver_at)
    return conn.execute(_sql.ENQUEUE, params).fetchone()[0]


async def aenqueue(conn, topic, payload, *, key=None, headers=None, dedup_key=None, deliver_at=None):
    """``enqueue`` on an AsyncConnection."""
    params = _enqueue_params(topic, payload, key, headers, dedup_key, deliver_at)
    return (await (await conn.execute(_sql.ENQUEUE, params)).fetchone())[0]


def settlement(value, error, classify=default_classify):
    """What to do with an event once its handler has run: ('ack',),
    ('nack', error, retryable, retry_in), ('release', retry_in) (pending
    again after retry_in seconds, its attempt not counted) or ('leave',) (it
    comes back when its lease ends). A handler may return the Job of its
    claim, or let the claim's NotClaimed through (the same as returning its
    job). A classify that raises is logged, and the default classification
    applies."""
    if isinstance(error, NotClaimed):
        value, error = error.job, None
    if error is not None:
        if is_stale_token(error):
            return ("leave",)
        final = classify_or(classify, default_classify, error) == "final"
        return ("nack", error_text(error), not final,
                None if final else retry_in_or_none(getattr(error, "retry_in", None)))
    if not isinstance(value, JobState):
        return ("ack",)
    outcome = value.outcome
    if outcome == "completed" or (outcome == "failed" and value.replayed):
        return ("ack",)
    if outcome == "failed":
        return ("nack", value.error, value.retryable, value.retry_after if value.retryable else None)
    if outcome in ("in_progress", "retry_later"):
        # Another worker holds the key, or its own backoff runs: the event
        # did not fail. Counting an attempt each time would make it a dead
        # letter while the holder works (retry_after is when the holder is
        # expected to finish: milliseconds apart).
        return ("release", value.retry_after)
    if outcome == "released":
        return ("nack", "released", True, None)
    if outcome == "mismatch":
        return ("nack", "the event does not carry the request its key was used with", False, None)
    return ("leave",)   # fenced: the worker that took the key over holds the redelivered event


class _ConsumerSettings:
    """What Consumer and AsyncConsumer are given: one place for both."""

    def __init__(self, conninfo, topics=None, *, name=None, lease=60, batch=1, poll=1.0,
                 classify=default_classify, log=None, on_fenced=None):
        self.conninfo = conninfo
        if isinstance(topics, (str, bytes)):
            raise ValueError(f"topics must be a list of topics (or None), not the string {topics!r}")
        self.topics = list(topics) if topics is not None else None
        self.name = name or f"consumer-{os.getpid()}"
        self.lease = seconds("lease", lease, 60, positive=True)
        self.batch = count("batch", batch, 1, MAX_BATCH)
        self.poll = seconds("poll", poll, 1.0, positive=True)
        self.classify = classify
        self.log = log or (lambda message: print(f"[{self.name}] {message}", file=sys.stderr, flush=True))
        self.hooks = Hooks(on_fenced=on_fenced)
        self.stopping = False


class Consumer(_ConsumerSettings):
    """Claims events of ``topics`` one at a time and runs ``handler(event)``
    (a dict: id, topic, key, payload, headers, dedup_key, attempt); acks or
    nacks by ``settlement``. Wakes on the outbox's notifications (not through
    a pooler, see pooler.py), polls every ``poll`` seconds as well. ``run()`` returns after ``stop()`` (safe in a
    signal handler), once the event in hand is settled.

        Consumer(conninfo, ["invoice.email"], name="worker-1").run(handle)
    """

    def __init__(self, conninfo, topics=None, **options):
        super().__init__(conninfo, topics, **options)
        self._wake_read, self._wake_write = os.pipe()

    def stop(self):
        self.stopping = True
        os.write(self._wake_write, b"x")

    def run(self, handler):
        with contextlib.ExitStack() as opened:
            conn, pooled = connect(self.conninfo, application_name=self.name)
            opened.enter_context(conn)
            listener = None
            if not pooled:
                listener = opened.enter_context(psycopg.connect(
                    self.conninfo, autocommit=True, application_name=f"{self.name} listener"))
                listener.execute(_sql.LISTEN)
            params = {"relay": self.name, "batch": self.batch, "lease": self.lease, "topics": self.topics}
            while not self.stopping:
                events = dict_cursor(conn).execute(_sql.OUTBOX_CLAIM, params).fetchall()
                for event in events:
                    self._handle(conn, handler, event)
                if not events:
                    self._idle(listener)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _handle(self, conn, handler, event):
        value, error = None, None
        try:
            value = handler(event)
        except Exception as exc:   # the handler's failure is the event's
            error = exc
        sql, params, hold = _settle(self, event, value, error)
        if hold and not self.stopping:   # stop() ends the wait
            if self._wake_read in select.select([self._wake_read], [], [], hold)[0]:
                os.read(self._wake_read, 64)
        if sql:
            conn.execute(sql, params)

    def _idle(self, listener):
        """Waits for a notification (when listening), stop() or the poll interval."""
        watched = [self._wake_read] + ([listener.fileno()] if listener is not None else [])
        ready = select.select(watched, [], [], self.poll)[0]
        if listener is not None and listener.fileno() in ready:
            listener.execute("SELECT 1")     # takes in the notifications
        if self._wake_read in ready:
            os.read(self._wake_read, 64)


def _settle(consumer, event, value, error):
    """The statement that settles ``event`` (or None), with its logging and
    hooks, and how many seconds to keep the event before it."""
    if error is not None and not isinstance(error, NotClaimed):
        consumer.log(f"event {event['id']}: {error!r}")
    action, *args = settlement(value, error, consumer.classify)
    job = error.job if isinstance(error, NotClaimed) else value
    if action == "leave":
        consumer.hooks.fenced(job if isinstance(job, JobState) else _Stale(event, error), event_id=event["id"])
        return None, None, 0
    if action == "ack":
        return _sql.OUTBOX_ACK, {"id": event["id"]}, 0
    if action == "release":
        # Kept retry_in, at least the poll interval (so that it is not
        # claimed again at once, over and over) and at most half the lease
        # (released, its attempt is not counted; expired, it would be).
        hold = min(max(args[0] or 0, consumer.poll), consumer.lease / 2)
        return _sql.OUTBOX_RELEASE, {"id": event["id"], "relay": consumer.name}, hold
    error_text, retryable, retry_in = args
    return (_sql.OUTBOX_NACK, {"id": event["id"], "error": error_text, "retryable": retryable,
                               "retry_in": retry_in}, 0)


class _Stale:
    """What on_fenced is told about an event whose handler raised IK001."""

    def __init__(self, event, error):
        self.key, self.scope, self.outcome = event.get("key"), None, "fenced"
        self.retry_after = self.token = self.attempt = None
        self.error = str(error)


class AsyncConsumer(_ConsumerSettings):
    """``Consumer`` for asyncio: ``await AsyncConsumer(conninfo, topics,
    name=...).run(handler)`` with ``handler(event)`` a coroutine function
    (a plain function works too); the same settlement. ``stop()`` (from the
    event loop's thread, e.g. in ``loop.add_signal_handler``) ends ``run()``
    once the event in hand is settled; ``run()`` is bounded after it: the
    listener is closed, not waited for.

        await AsyncConsumer(conninfo, ["invoice.email"], name="worker-1").run(handle)
    """

    def __init__(self, conninfo, topics=None, **options):
        super().__init__(conninfo, topics, **options)
        self._wake = None

    def stop(self):
        self.stopping = True
        if self._wake is not None:
            self._wake.set()
            self._stopped.set()

    async def run(self, handler):
        self._wake = asyncio.Event()      # a notification or stop()
        self._stopped = asyncio.Event()   # stop() alone
        if self.stopping:
            return
        conn, pooled = await aconnect(self.conninfo, application_name=self.name)
        listener = listening = None
        try:
            if not pooled:
                listener = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                                  application_name=f"{self.name} listener")
                await listener.execute(_sql.LISTEN)
                listening = asyncio.create_task(self._listen(listener))
            params = {"relay": self.name, "batch": self.batch, "lease": self.lease, "topics": self.topics}
            while not self.stopping:
                self._wake.clear()
                cur = dict_cursor(conn)
                events = await (await cur.execute(_sql.OUTBOX_CLAIM, params)).fetchall()
                for event in events:
                    await self._handle(conn, handler, event)
                if not events and not self.stopping:
                    try:
                        await asyncio.wait_for(self._wake.wait(), self.poll)
                    except asyncio.TimeoutError:
                        pass
        finally:
            if listening is not None:
                listening.cancel()
            for c in (listener, conn):
                if c is None:
                    continue
                try:
                    await asyncio.wait_for(c.close(), 5)
                except Exception:
                    pass
            if listening is not None:
                await asyncio.wait({listening}, timeout=1)

    async def _listen(self, listener):
        try:
            async for _ in listener.notifies():
                self._wake.set()
        except Exception:
            self._wake.set()    # the listener is gone: the loop polls

    async def _handle(self, conn, handler, event):
        value, error = None, None
        try:
            value = handler(event)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:   # the handler's failure is the event's
            error = exc
        sql, params, hold = _settle(self, event, value, error)
        if hold and not self.stopping:   # stop() ends the wait
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), hold)
        if sql:
            await conn.execute(sql, params)
