"""Shared by the tests: connections to the cluster the harness started (PG*
environment) as the application role, and as the superuser to read the
extension's tables; fresh keys; waiting for a condition."""

import os
import time
import uuid

import psycopg
import pytest

# Quick retries for the tests: the first backoff is 50 to 100 ms.
SETTINGS = "-c idempotency.retry_base_delay=100ms"


def connect(**kwargs):
    return psycopg.connect(options=SETTINGS, **kwargs)


@pytest.fixture
def conn():
    with connect() as c:
        yield c


@pytest.fixture
def other():
    """A second application connection: another worker."""
    with connect(autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def admin():
    with psycopg.connect(user=os.environ.get("PGADMIN_USER", "postgres"), autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS effects (key text, worker text)")
        c.execute("GRANT SELECT, INSERT ON effects TO PUBLIC")
        yield c


@pytest.fixture
def new_key():
    return lambda prefix="key": f"{prefix}-{uuid.uuid4()}"


def wait_for(what, fn, seconds=20):
    deadline = time.monotonic() + seconds
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def key_row(admin, key, scope="default"):
    return admin.execute("SELECT status::text, attempts FROM idempotency.idempotency_keys WHERE scope = %s AND key = %s",
                         (scope, key)).fetchone()


def effects(admin, key):
    return [r[0] for r in admin.execute("SELECT worker FROM effects WHERE key = %s ORDER BY worker", (key,))]


def estimates_retry_after(conn):
    """The feature probe of the Retry-After estimate: does `retry_after` of an
    in_progress answer estimate when the work will be done (recent
    completion durations of the scope, capped by the lease left) rather than
    give the whole lease left? In a scope of its own: five keys claimed and
    completed at once, then a fourth claimed with a 60 s lease and claimed
    again from another connection. An estimate is well under the lease."""
    scope = f"probe-{uuid.uuid4()}"
    claim = ("SELECT outcome::text, token, extract(epoch FROM retry_after)::float8 FROM idempotency.idem_claim("
             "%s, lease => '60s', scope => %s)")
    with psycopg.connect(autocommit=True) as a, psycopg.connect(autocommit=True) as b:
        for n in range(5):
            _, token, _ = a.execute(claim, (f"done-{n}", scope)).fetchone()
            a.execute("SELECT idempotency.idem_complete(%s, %s, scope => %s)", (f"done-{n}", token, scope))
        _, token, _ = a.execute(claim, ("held", scope)).fetchone()
        outcome, _, retry_after = b.execute(claim, ("held", scope)).fetchone()
        a.execute("SELECT idempotency.idem_complete('held', %s, scope => %s)", (token, scope))
    return outcome == "in_progress" and retry_after is not None and retry_after < 30


def expire_result(admin, key, scope="default"):
    """What the purge leaves of a finished key once its result's retention
    has passed: its tombstone, made as the purge makes it (docs/keys.md, the
    digest and the fingerprint's prefix in SQL), for this key alone so that
    no other test's keys are touched."""
    moved = admin.execute(r"""
        WITH gone AS (DELETE FROM idempotency.idempotency_keys WHERE scope = %s AND key = %s
                      RETURNING scope, key, status, fingerprint)
        INSERT INTO idempotency.key_tombstones (key_digest, forget_at, fingerprint, status)
        SELECT encode(substr(sha256(convert_to(scope, 'UTF8') || '\x00'::bytea || convert_to(key, 'UTF8')), 1, 16),
                      'hex')::uuid,
               now() + interval '1 day', ('x' || encode(substr(fingerprint, 1, 4), 'hex'))::bit(32)::int4, status
          FROM gone""", (scope, key)).rowcount
    assert moved == 1, f"no finished key {scope}/{key} to expire"


def terminate_backends(admin, application_name):
    """Ends the server sessions of ``application_name``, as a restart does,
    and waits until they are gone. Those ended are waited for, not the name:
    a pool still opening a connection opens it with that name afterwards."""
    pids = [pid for (pid, ended) in admin.execute(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (application_name,)).fetchall() if ended]
    deadline = time.monotonic() + 30
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0] > 0:
        assert time.monotonic() < deadline, f"the sessions {pids} did not end"
        time.sleep(0.05)
