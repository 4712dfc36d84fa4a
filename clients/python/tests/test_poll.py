"""The wait of a claim on a connection through a pooler (waiting.poll and
apoll): tries until an answer other than in_progress / retry_later, or the
wait's end; and how a claim tells a pooler from a direct connection."""

import asyncio
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest

import pg_idempotency as idem
from pg_idempotency import pooler
from pg_idempotency.waiting import AsyncOwners, ThreadOwners, apoll, poll
from conftest import SETTINGS

BUSY = {"outcome": "in_progress", "retry_after": 0.5}


def answers(*rows):
    """attempt() answering rows in turn (the last one from then on; an
    exception is raised), and the times of its calls."""
    calls = []

    def attempt():
        calls.append(time.monotonic())
        row = rows[min(len(calls), len(rows)) - 1]
        if isinstance(row, Exception):
            raise row
        return row
    return attempt, calls


RESTARTING = psycopg.OperationalError("the test failed this try (the server restarting)")
DONE = {"outcome": "completed", "retry_after": None}
JOB = SimpleNamespace(scope="poll", key="k", request=None)


def waits_of_each_kind():
    """(name, wait(attempt, seconds)) for each loop a waiting claim polls in."""
    def aio(run):
        def wait(attempt, seconds):
            async def aattempt():
                return attempt()
            return asyncio.run(run(aattempt, seconds))
        return wait
    return [("poll", poll), ("apoll", aio(apoll)),
            ("ThreadOwners", lambda attempt, seconds: ThreadOwners().claim(attempt, JOB, seconds)),
            ("AsyncOwners", aio(lambda attempt, seconds: AsyncOwners().claim(attempt, JOB, seconds)))]


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


@pytest.mark.parametrize("name,wait", waits_of_each_kind())
def test_a_failed_try_answers_nothing_and_the_wait_goes_on(name, wait):
    attempt, calls = answers(BUSY, RESTARTING, BUSY, DONE)
    assert wait(attempt, 10) is DONE, name
    assert len(calls) == 4, name


@pytest.mark.parametrize("name,wait", waits_of_each_kind())
def test_a_wait_that_ends_while_the_latest_try_failed_raises_its_error(name, wait):
    attempt, calls = answers(BUSY, RESTARTING)
    with pytest.raises(psycopg.OperationalError) as raised:
        wait(attempt, 0.3)
    assert raised.value is RESTARTING, name
    assert len(calls) >= 3, name


@pytest.mark.parametrize("name,wait", waits_of_each_kind())
def test_a_first_try_that_fails_is_raised_at_once(name, wait):
    attempt, calls = answers(RESTARTING, DONE)
    with pytest.raises(psycopg.OperationalError):
        wait(attempt, 10)
    assert len(calls) == 1, name


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


def _complete_soon(holder, result):
    timer = threading.Timer(0.5, lambda: holder.complete(result))
    timer.start()
    return timer


def _waited_for_holder(conn, other, key, result, wait_for_it):
    """What wait_for_it() answers while `other` holds `key` and completes it
    with `result` 0.5 s in; and how long it took."""
    with idem.claim(other, key, heartbeat=False) as holder:
        done = _complete_soon(holder, result)
        started = time.monotonic()
        try:
            job = wait_for_it()
        finally:
            done.join()
    return job, time.monotonic() - started


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_a_claim_that_waits_on_a_direct_connection_is_woken_by_the_complete(conn, other, new_key, isolation):
    """Also where transactions default to REPEATABLE READ: there the holder's
    commit fails the server's wait with 40001 (test below), and claim() asks
    again in a new transaction, which replays the result."""
    conn.execute(f"SET default_transaction_isolation = '{isolation}'")
    conn.commit()
    key = new_key()
    job, took = _waited_for_holder(conn, other, key, {"n": 1},
                                   lambda: idem.run_once(conn, key, lambda job: "never", wait=10))
    assert (job.outcome, job.result) == ("completed", {"n": 1})
    assert took < 5


def test_under_repeatable_read_the_servers_wait_fails_when_the_holder_commits(conn, other, new_key):
    conn.execute("SET default_transaction_isolation = 'repeatable read'")
    conn.commit()
    key = new_key()
    with pytest.raises(psycopg.errors.SerializationFailure):
        _waited_for_holder(conn, other, key, {"n": 0},
                           lambda: conn.execute("SELECT idempotency.idem_claim(%s, wait => '10 s')", (key,)))
    conn.rollback()


def test_under_repeatable_read_a_waiting_aclaim_is_asked_again(conn, other, new_key):
    key = new_key()

    async def scenario():
        async with await psycopg.AsyncConnection.connect(options=SETTINGS) as aconn:
            await aconn.execute("SET default_transaction_isolation = 'repeatable read'")
            await aconn.commit()

            async def never(job):
                raise AssertionError("work ran for a duplicate")
            return await idem.arun_once(aconn, key, never, wait=10)
    job, took = _waited_for_holder(conn, other, key, {"n": 2}, lambda: asyncio.run(scenario()))
    assert (job.outcome, job.result) == ("completed", {"n": 2})
    assert took < 5
