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


@pytest.mark.parametrize("value", [0, -1, "30", math.inf, math.nan, True, 1e-9, 1e12])
def test_a_lease_the_extension_refuses_whatever_its_settings_is_refused(conn, new_key, value):
    with pytest.raises(ValueError, match="lease must be a number of seconds from 1 µs to 2,147,483.647"):
        idem.claim(conn, new_key(), lease=value)
    with pytest.raises(ValueError, match="lease must be"):
        IdempotencyMiddleware(None, conninfo="", lease=value)
    with pytest.raises(ValueError, match="lease must be"):
        SyncIdempotency(conninfo="", lease=value)


@pytest.mark.parametrize("retry_in", [-1, 36000 * 86400 + 1, 1e11])
def test_a_wait_or_retry_in_that_is_not_seconds_is_refused(conn, new_key, retry_in):
    with pytest.raises(ValueError, match="wait must be a number of seconds from 0 to 2,147,483.647, not inf"):
        idem.claim(conn, new_key(), wait=math.inf)
    # Taken, the middleware's every retryable failure would be refused by
    # the server: the key stayed held and the handler ran again.
    with pytest.raises(ValueError, match="retry_in must be a number of seconds from 0 to 3,110,400,000"):
        IdempotencyMiddleware(None, conninfo="", retry_in=retry_in)
    with pytest.raises(ValueError, match="retry_in must be"):
        SyncIdempotency(conninfo="", retry_in=retry_in)
    assert SyncIdempotency(conninfo="", retry_in=36000 * 86400).retry_in == 36000 * 86400


@pytest.mark.parametrize("option, value, message", [
    ("scope", "s" * 64, "scope must be 1 to 63 bytes"), ("scope", "", "scope must be"),
    ("scope", "a\ud800", "scope must be"),
    ("header", "Idempotency Key", "header must be an HTTP header name"),
    ("replay_header", "Idempotent-Replayed\n", "replay_header must be an HTTP header name"),
    # A string's letters were taken for methods or prefixes: no request was
    # covered, or every one was.
    ("methods", "POST", "methods must be a list or tuple of HTTP method names"), ("methods", [1], "methods must be"),
    ("methods", (), "methods must be"), ("methods", ["PO ST"], "methods must be"),
    ("paths", "/orders", "paths must be a list or tuple of path prefixes"), ("paths", [""], "paths must be"),
    ("required", "no", "required must be True or False"), ("required", None, "required must be"),
    ("fingerprint", 1, "fingerprint must be a function"), ("classify", "x", "classify must be a function"),
    ("completed_response", "x", "completed_response must be a function"),
    ("failed_response", 1, "failed_response must be a function"),
    ("expired_response", "x", "expired_response must be a function"),
    ("on_replay", "x", "on_replay must be a function"), ("on_conflict", 1, "on_conflict must be a function"),
    ("on_fenced", "x", "on_fenced must be a function"),
    ("pool", object(), "pool must be a psycopg_pool connection pool"),
])
def test_a_middleware_option_every_request_would_fail_on_is_refused_when_given(option, value, message):
    # A 64-byte scope failed every request (22001); a header name no request
    # carries, or a replay cannot send.
    with pytest.raises(ValueError, match=message):
        IdempotencyMiddleware(None, conninfo="", **{option: value})
    with pytest.raises(ValueError, match=message):
        SyncIdempotency(conninfo="", **{option: value})
    assert SyncIdempotency(conninfo="", scope="é" * 31 + "s").scope == "é" * 31 + "s"   # 63 bytes
    assert SyncIdempotency(conninfo="", methods=["post"], paths={"/a"}).methods == {"POST"}


@pytest.mark.parametrize("option, value, message", [
    ("topics", "jobs.t", "topics must be a list"),
    ("lease", 0, "lease must be"), ("lease", -1, "lease must be"), ("lease", math.nan, "lease must be"),
    ("lease", "x", "lease must be"),
    ("batch", 0, "batch must be a whole number from 1 to 10000"), ("batch", None, "batch must be"),
    ("batch", 10001, "batch must be"), ("batch", 1.5, "batch must be"),
    ("poll", 0, "poll must be"), ("poll", -1, "poll must be"),
])
def test_a_consumer_option_the_extension_would_refuse_is_refused_when_given(option, value, message):
    topics = {"topics": ["jobs.t"]}
    for make in (idem.Consumer, idem.AsyncConsumer):
        with pytest.raises(ValueError, match=message):
            make("", **{**topics, option: value})


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
