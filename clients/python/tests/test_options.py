"""Options are checked when given: a lease or wait that is not a finite
number of seconds is refused at once, saying so (a lease of None or "30"
crashed the heartbeat thread after the work ran, and left the key held),
and None keeps the default. A result that is not JSON fails its key for
good instead of leaving it held, to run again once the lease ended."""

import asyncio
import datetime
import math

import psycopg
import pytest

import pg_idempotency as idem
from conftest import SETTINGS, key_row
from pg_idempotency.asgi import IdempotencyMiddleware
from pg_idempotency.sync import SyncIdempotency


@pytest.mark.parametrize("value", [0, -1, "30", math.inf, math.nan, True])
def test_a_lease_that_is_not_seconds_above_0_is_refused(conn, new_key, value):
    with pytest.raises(ValueError, match="lease must be a finite number of seconds above 0"):
        idem.claim(conn, new_key(), lease=value)
    with pytest.raises(ValueError, match="lease must be"):
        IdempotencyMiddleware(None, conninfo="", lease=value)
    with pytest.raises(ValueError, match="lease must be"):
        SyncIdempotency(conninfo="", lease=value)


def test_a_wait_or_retry_in_that_is_not_seconds_is_refused(conn, new_key):
    with pytest.raises(ValueError, match="wait must be a finite number of seconds from 0, not inf"):
        idem.claim(conn, new_key(), wait=math.inf)
    with pytest.raises(ValueError, match="retry_in must be"):
        IdempotencyMiddleware(None, conninfo="", retry_in=-1)


def test_none_keeps_the_default_lease(conn, admin, new_key):
    key = new_key()
    job = idem.run_once(conn, key, lambda job: "ok", lease=None)
    assert job.outcome == "completed" and job.lease == 30
    assert IdempotencyMiddleware(None, conninfo="", lease=None).lease == 30


@pytest.mark.parametrize("value", [datetime.datetime(2026, 1, 1), {1, 2}, object()])
def test_a_result_that_is_not_json_fails_the_key_for_good(conn, admin, new_key, value):
    key, runs = new_key(), []

    def work(job):
        runs.append(1)
        return {"at": value}
    job = idem.run_once(conn, key, work)
    assert (job.outcome, job.retryable) == ("failed", False)
    assert "cannot be stored as JSON" in job.error
    assert key_row(admin, key)[0] == "FAILED_FINAL"
    assert idem.run_once(conn, key, work).replayed and len(runs) == 1


def test_an_async_result_that_is_not_json_fails_the_key_for_good(admin, new_key):
    key = new_key()

    async def main():
        async with await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as conn:
            async def work(job):
                return {"at": datetime.date(2026, 1, 1)}
            return await idem.arun_once(conn, key, work)
    job = asyncio.run(main())
    assert (job.outcome, job.retryable) == ("failed", False)
    assert key_row(admin, key)[0] == "FAILED_FINAL"
