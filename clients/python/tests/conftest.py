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
