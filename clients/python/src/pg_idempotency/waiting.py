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
last answer is then sent (409 with Retry-After).

A duplicate that arrives while a request of this process holds its key
with the same fingerprint does not even make its first try: it waits for
that request's event, then claims.

The owner's heartbeat and its complete therefore always find a pool
connection after at most the tries in front of them, whatever the number of
waiting duplicates.
"""

import asyncio
import threading
import time

FIRST_PAUSE = 0.02
MAX_PAUSE = 0.25
WAITING = ("in_progress", "retry_later")


def _nap(row, left, pause, local):
    if row["outcome"] == "retry_later":
        return min(left, max(row["retry_after"] or 0.0, 0.01))
    return left if local else min(left, pause)


def _give_up(row, left):
    if row["outcome"] not in WAITING or left <= 0:
        return True
    return row["outcome"] == "retry_later" and (row["retry_after"] or 0.0) > left


class AsyncOwners:
    """The keys held by requests of this process (asyncio), and the wait of
    their duplicates."""

    def __init__(self):
        self.held = {}

    def hold(self, job):
        done = asyncio.Event()
        done.request = job.request
        self.held[(job.scope, job.key)] = done
        return done

    def release(self, job, done):
        done.set()
        if self.held.get((job.scope, job.key)) is done:
            del self.held[(job.scope, job.key)]

    async def _local(self, job, left):
        """Waits for a holder of this process with the same request; False if there is none."""
        done = self.held.get((job.scope, job.key))
        if done is None or done.is_set() or done.request != job.request or left <= 0:
            return False
        try:
            await asyncio.wait_for(done.wait(), left)
        except asyncio.TimeoutError:
            pass
        return True

    async def claim(self, attempt, job, wait):
        """Awaits attempt() (one claim without wait) until it answers
        anything but in_progress / retry_later, or ``wait`` seconds passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait or 0)
        pause = FIRST_PAUSE
        await self._local(job, wait or 0)
        while True:
            row = await attempt()
            left = deadline - loop.time()
            if _give_up(row, left):
                return row
            done = self.held.get((job.scope, job.key))
            nap = _nap(row, left, pause, done is not None)
            if done is not None and not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), nap)
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(nap)
            pause = min(pause * 2, MAX_PAUSE)


class ThreadOwners:
    """AsyncOwners for threaded servers (WSGI, Django)."""

    def __init__(self):
        self.held = {}
        self.lock = threading.Lock()

    def hold(self, job):
        done = threading.Event()
        done.request = job.request
        with self.lock:
            self.held[(job.scope, job.key)] = done
        return done

    def release(self, job, done):
        done.set()
        with self.lock:
            if self.held.get((job.scope, job.key)) is done:
                del self.held[(job.scope, job.key)]

    def claim(self, attempt, job, wait):
        deadline = time.monotonic() + (wait or 0)
        pause = FIRST_PAUSE
        with self.lock:
            done = self.held.get((job.scope, job.key))
        if wait and done is not None and done.request == job.request:
            done.wait(wait)
        while True:
            row = attempt()
            left = deadline - time.monotonic()
            if _give_up(row, left):
                return row
            with self.lock:
                done = self.held.get((job.scope, job.key))
            nap = _nap(row, left, pause, done is not None)
            if done is not None:
                done.wait(nap)
            else:
                time.sleep(nap)
            pause = min(pause * 2, MAX_PAUSE)
