"""The wait of a claim on a connection through a pooler (waiting.poll and
apoll): tries until an answer other than in_progress / retry_later, or the
wait's end; and how a claim tells a pooler from a direct connection."""

import asyncio
import threading
import time

import pg_idempotency as idem
from pg_idempotency import pooler
from pg_idempotency.waiting import apoll, poll

BUSY = {"outcome": "in_progress", "retry_after": 0.5}


def answers(*rows):
    """attempt() answering rows in turn (the last one from then on), and the
    times of its calls."""
    calls = []

    def attempt():
        calls.append(time.monotonic())
        return rows[min(len(calls), len(rows)) - 1]
    return attempt, calls


def test_poll_returns_the_first_settled_answer_with_growing_pauses():
    done = {"outcome": "completed", "retry_after": None}
    attempt, calls = answers(BUSY, BUSY, BUSY, done)
    assert poll(attempt, 10) is done
    pauses = [b - a for a, b in zip(calls, calls[1:])]
    assert len(pauses) == 3
    assert pauses[0] >= 0.02 and pauses[1] >= 0.04 and pauses[2] >= 0.08, pauses


def test_poll_gives_up_with_the_last_answer_when_the_wait_ends():
    attempt, calls = answers(BUSY)
    started = time.monotonic()
    assert poll(attempt, 0.3) is BUSY
    took = time.monotonic() - started
    assert 0.3 <= took < 2.0, took
    assert len(calls) >= 3


def test_poll_does_not_wait_for_a_retry_beyond_the_wait():
    later = {"outcome": "retry_later", "retry_after": 60.0}
    attempt, calls = answers(later)
    assert poll(attempt, 5) is later
    assert len(calls) == 1


def test_poll_tries_again_when_the_retry_is_due():
    soon = {"outcome": "retry_later", "retry_after": 0.1}
    claimed = {"outcome": "claimed", "retry_after": None}
    attempt, calls = answers(soon, claimed)
    assert poll(attempt, 5) is claimed
    assert calls[1] - calls[0] >= 0.1


def test_apoll_as_poll():
    done = {"outcome": "failed", "retry_after": None}
    attempt, calls = answers(BUSY, done)

    async def aattempt():
        return attempt()
    assert asyncio.run(apoll(aattempt, 10)) is done
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.02


def test_a_direct_connection_is_not_taken_for_a_pooler_and_is_asked_once(conn):
    assert pooler.behind_pooler(conn) is False
    asked = []
    execute = conn.execute
    conn.execute = lambda *args, **kwargs: asked.append(args) or execute(*args, **kwargs)
    try:
        assert pooler.behind_pooler(conn) is False
    finally:
        del conn.execute
    assert asked == []


def test_a_claim_that_waits_on_a_direct_connection_is_woken_by_the_complete(conn, other, new_key):
    key = new_key()
    with idem.claim(other, key, heartbeat=False) as holder:
        done = threading.Timer(0.5, lambda: holder.complete({"n": 1}))
        done.start()
        started = time.monotonic()
        job = idem.run_once(conn, key, lambda job: "never", wait=10)
        done.join()
    assert (job.outcome, job.result) == ("completed", {"n": 1})
    assert time.monotonic() - started < 5
