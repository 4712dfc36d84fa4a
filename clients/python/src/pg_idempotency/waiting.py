"""How a duplicate waits for the holder of its key without holding a pool
connection: each try is one claim without ``wait`` (a read of the key, on a
pool connection for a millisecond or so), and between tries the duplicate
holds nothing. A duplicate whose holder is a request of this same process
sleeps, without polling, until that request has recorded its outcome (an
event set after the commit, whatever way the request ends), so it answers
at once; otherwise it polls, 20 ms after the first try and then twice as
long each time, up to 250 ms. A key waiting for its
retry (``retry_later``) is tried again when its backoff has passed, if
that is within the bound. The wait never lasts longer than ``wait``: the
last answer is then sent (409 with Retry-After). A later try that fails
(the database restarting) answers nothing: the wait goes on with the last
answer, and only a wait that ends while the latest try failed raises its
error.

A duplicate that arrives while a request of this process holds its key
with the same fingerprint does not even make its first try: it waits for
that request's event, and takes the answer the holder recorded (its
stored response, or its final failure) without a claim; after a
retryable failure it claims (and one of the duplicates runs the handler).
When their wait ends first, the duplicates of one holder share one claim
for their 409 (one every 100 ms at most).

The owner's heartbeat and its complete therefore always find a pool
connection after at most the tries in front of them, whatever the number of
waiting duplicates.
"""

import asyncio
import threading
import time

import psycopg

FIRST_PAUSE = 0.02
MAX_PAUSE = 0.25
SHARE_FOR = 0.1       # how long one in_progress answer serves a holder's other duplicates
WAITING = ("in_progress", "retry_later")


def _nap(row, left, pause, local):
    if row["outcome"] == "retry_later":
        return min(left, max(row["retry_after"] or 0.0, 0.01))
    return left if local else min(left, pause)


def _give_up(row, left):
    if row["outcome"] not in WAITING or left <= 0:
        return True
    return row["outcome"] == "retry_later" and (row["retry_after"] or 0.0) > left


def _try_again(attempt, row):
    """A later try, and its error: one that fails keeps the last answer."""
    try:
        return attempt(), None
    except psycopg.Error as err:
        return row, err


async def _atry_again(attempt, row):
    try:
        return await attempt(), None
    except psycopg.Error as err:
        return row, err


def _answer(row, failed, left):
    """Whether the wait ends with ``row``; raises ``failed`` (the latest
    try's error) when the wait has passed."""
    if failed is not None and left <= 0:
        raise failed
    return _give_up(row, left)


def poll(attempt, wait):
    """Calls attempt() (one claim without ``wait``, in a transaction of its
    own) until it answers anything but in_progress / retry_later or ``wait``
    seconds passed, holding no server connection between tries: the wait of
    a claim on a connection through a pooler."""
    deadline = time.monotonic() + wait
    pause = FIRST_PAUSE
    row, failed = attempt(), None
    while True:
        left = deadline - time.monotonic()
        if _answer(row, failed, left):
            return row
        time.sleep(_nap(row, left, pause, False))
        pause = min(pause * 2, MAX_PAUSE)
        row, failed = _try_again(attempt, row)


async def apoll(attempt, wait):
    """``poll`` for asyncio: ``attempt`` is a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = FIRST_PAUSE
    row, failed = await attempt(), None
    while True:
        left = deadline - loop.time()
        if _answer(row, failed, left):
            return row
        await asyncio.sleep(_nap(row, left, pause, False))
        pause = min(pause * 2, MAX_PAUSE)
        row, failed = await _atry_again(attempt, row)


def asked_again(attempt, wait):
    """Calls attempt(wait) (one claim that waits in the server, in a
    transaction of the client's own). Where transactions default to
    REPEATABLE READ or SERIALIZABLE, the holder's commit fails such a claim
    with 40001: its snapshot cannot see the answer. It is then asked again,
    in a new transaction that can, with what is left of the wait (none:
    one claim that does not wait, whose failure is raised)."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        try:
            return attempt(left if left > 0 else None)
        except psycopg.errors.SerializationFailure:
            if left <= 0:
                raise


async def aasked_again(attempt, wait):
    """``asked_again`` for asyncio: ``attempt`` is a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        left = deadline - loop.time()
        try:
            return await attempt(left if left > 0 else None)
        except psycopg.errors.SerializationFailure:
            if left <= 0:
                raise


def answered_row(job, outcome, result=None, error=None):
    """The answer a claim of the key would give once its holder in this
    process recorded ``outcome`` ('completed' or 'failed' for good): handed to
    the duplicates that waited for it, instead of a claim each."""
    return {"outcome": outcome, "status": "COMPLETED" if outcome == "completed" else "FAILED_FINAL",
            "token": None, "attempt": job.attempt, "result": result, "error": error, "retry_after": None,
            "job_ref": None, "result_expired": False}


class AsyncOwners:
    """The keys held by requests of this process (asyncio), and the wait of
    their duplicates."""

    def __init__(self):
        self.held = {}

    def hold(self, job):
        done = asyncio.Event()
        done.request, done.row = job.request, None
        self.held[(job.scope, job.key)] = done
        return done

    def release(self, job, done, row=None):
        """The holder is done; ``row``: what it recorded, for its duplicates
        (None: they claim again, as after a retryable failure)."""
        done.row = row
        done.set()
        if self.held.get((job.scope, job.key)) is done:
            del self.held[(job.scope, job.key)]

    def _same(self, job):
        done = self.held.get((job.scope, job.key))
        return done if done is not None and done.request == job.request else None

    async def claim(self, attempt, job, wait):
        """Awaits attempt() (one claim without wait) until it answers
        anything but in_progress / retry_later, or ``wait`` seconds passed.
        With a holder of the same request in this process it waits for that
        holder instead, and takes its answer when it recorded one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait or 0)
        pause = FIRST_PAUSE
        row = failed = None
        while True:
            done, left = self._same(job), deadline - loop.time()
            if done is not None and left > 0 and not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), left)
                except asyncio.TimeoutError:
                    pass
            if done is not None and done.is_set() and done.row is not None:
                return done.row
            if done is not None and not done.is_set():
                shared = await self._shared_claim(done, attempt)
                if shared is not None:
                    return shared
            if row is None:
                row = await attempt()
            else:
                row, failed = await _atry_again(attempt, row)
            left = deadline - loop.time()
            if _answer(row, failed, left):
                return row
            following = self._same(job)
            if following is not None and not following.is_set():
                continue        # wait for it at the top
            local = self.held.get((job.scope, job.key)) is not None
            await asyncio.sleep(_nap(row, left, pause, local))
            pause = min(pause * 2, MAX_PAUSE)

    @staticmethod
    async def _shared_claim(done, attempt):
        """The waits of a holder's duplicates ended and it still works: one
        claim (at most one every SHARE_FOR seconds) answers them all with its
        in_progress (and its retry_after), instead of a crowd of claims at
        the same moment. The duplicate whose claim it was also takes any other
        answer; the others then claim on their own (None)."""
        loop = asyncio.get_running_loop()
        shared = getattr(done, "probe", None)
        mine = shared is None or (shared.done() and loop.time() - done.probe_at > SHARE_FOR)
        if mine:
            shared = done.probe = loop.create_task(attempt())
            done.probe_at = loop.time()
        row = await asyncio.shield(shared)
        return row if mine or row["outcome"] in WAITING else None


class ThreadOwners:
    """AsyncOwners for threaded servers (WSGI, Django)."""

    def __init__(self):
        self.held = {}
        self.lock = threading.Lock()

    def hold(self, job):
        done = threading.Event()
        done.request, done.row = job.request, None
        with self.lock:
            self.held[(job.scope, job.key)] = done
        return done

    def release(self, job, done, row=None):
        done.row = row
        done.set()
        with self.lock:
            if self.held.get((job.scope, job.key)) is done:
                del self.held[(job.scope, job.key)]

    def _same(self, job):
        with self.lock:
            done = self.held.get((job.scope, job.key))
        return done if done is not None and done.request == job.request else None

    def claim(self, attempt, job, wait):
        deadline = time.monotonic() + (wait or 0)
        pause = FIRST_PAUSE
        row = failed = None
        while True:
            done, left = self._same(job), deadline - time.monotonic()
            if done is not None and left > 0:
                done.wait(left)
            if done is not None and done.is_set() and done.row is not None:
                return done.row
            if row is None:
                row = attempt()
            else:
                row, failed = _try_again(attempt, row)
            left = deadline - time.monotonic()
            if _answer(row, failed, left):
                return row
            following = self._same(job)
            if following is not None and not following.is_set():
                continue
            with self.lock:
                local = (job.scope, job.key) in self.held
            time.sleep(_nap(row, left, pause, local))
            pause = min(pause * 2, MAX_PAUSE)
