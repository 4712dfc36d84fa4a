"""start_maintenance and astart_maintenance: idem_maintenance() on an
interval, the SQL edition's stand-in for the C++ extension's background
workers. Against the SQL edition (IDEM_EDITION=sql) nothing else expires a
lease that nobody claims again, or settles a finished key: these calls
alone do. The superuser calls it (the application role may not)."""

import asyncio
import math
import os
import threading
import time
import uuid

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pg_idempotency as idem
from conftest import wait_for

ADMIN = f"user={os.environ.get('PGADMIN_USER', 'postgres')}"
SQL_EDITION = os.environ.get("IDEM_EDITION") == "sql"


def live_row(admin, key):
    return admin.execute("SELECT status::text, attempts, active_since IS NOT NULL, purge_at IS NOT NULL "
                         "FROM idempotency.idempotency_keys WHERE scope = 'default' AND key = %s", (key,)).fetchone()


@pytest.fixture
def no_rights_role(admin):
    """A role with the application's rights and not idem_maintenance's."""
    role = f"maint_{uuid.uuid4().hex[:12]}"
    admin.execute(f"CREATE ROLE {role} LOGIN")
    admin.execute("SELECT idempotency.grant_application(%s)", (role,))
    yield role
    admin.execute("SELECT idempotency.revoke_role(%s)", (role,))
    admin.execute(f"REVOKE ALL ON FUNCTION idempotency.idem_maintenance() FROM {role}")
    admin.execute(f"DROP ROLE {role}")


def test_passes_expire_a_lease_nobody_claims_again_and_stop_ends_them(conn, admin, new_key):
    key = new_key("sweep")
    conn.execute("SELECT idempotency.idem_claim(%s, lease => interval '200 milliseconds')", (key,))
    conn.commit()
    passes = []
    sweeps = idem.start_maintenance(ADMIN, interval=0.1, on_pass=passes.append)
    try:
        wait_for("the expired lease", lambda: live_row(admin, key)[0] == "FAILED_RETRYABLE")
        assert live_row(admin, key)[1] == 1
        # With the C++ extension its worker may expire the lease before the
        # first pass has ended: the pass is waited for, not assumed.
        wait_for("a pass", lambda: passes)
        assert {"expire_leases", "settle_leases", "purge_keys"} <= set(passes[0]), passes[0]
        if SQL_EDITION:
            # The row is seen expired once the pass commits, before its report.
            wait_for("the report of the pass that expired it",
                     lambda: sum(p["expire_leases"] for p in passes) >= 1)
    finally:
        sweeps.stop()
    done = len(passes)
    time.sleep(0.35)     # several intervals: none may pass now
    assert len(passes) == done, "no pass after stop()"


def test_async_passes_on_a_pool_settle_a_finished_key(conn, admin, new_key):
    key = new_key("settle")
    token = conn.execute("SELECT token FROM idempotency.idem_claim(%s)", (key,)).fetchone()[0]
    conn.execute("SELECT idempotency.idem_complete(%s, %s, '{\"ok\": true}')", (key, token))
    conn.commit()
    passes = []

    async def main():
        async with AsyncConnectionPool(ADMIN, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
            async with idem.astart_maintenance(pool, interval=0.1, on_pass=passes.append):
                deadline = time.monotonic() + 20
                # The SQL edition's settling pass is awaited as reported too:
                # the row is seen settled once the pass commits, before its report.
                while live_row(admin, key)[2] or (SQL_EDITION and not any(p["settle_leases"] for p in passes)):
                    assert time.monotonic() < deadline, "the finished key was never settled"
                    await asyncio.sleep(0.05)
            settled_after = len(passes)
            await asyncio.sleep(0.35)
            assert len(passes) == settled_after, "no pass after the block"

    asyncio.run(main())
    status, _, live, filed = live_row(admin, key)
    assert (status, live, filed) == ("COMPLETED", False, True)
    if SQL_EDITION:
        assert sum(p["settle_leases"] for p in passes) >= 1, passes


def test_a_failed_pass_is_reported_and_the_next_one_is_still_made(admin, no_rights_role):
    errors, passes = [], []
    with ConnectionPool(f"user={no_rights_role}", min_size=1, max_size=1) as pool:
        sweeps = idem.start_maintenance(pool, interval=0.05, on_pass=passes.append, on_error=errors.append)
        try:
            wait_for("two failed passes", lambda: len(errors) >= 2)
            assert "permission denied for function idem_maintenance" in str(errors[0])
            assert not passes
            admin.execute(f"GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance() TO {no_rights_role}")
            wait_for("a pass once the role may call it", lambda: passes)
        finally:
            sweeps.stop()
    assert "purge_keys" in passes[0]


def test_the_async_caller_reports_failures_on_its_own_connection_and_goes_on(admin, no_rights_role):
    errors, passes = [], []

    async def main():
        sweeps = idem.astart_maintenance(f"user={no_rights_role}", interval=0.05, on_pass=passes.append,
                                         on_error=errors.append)
        try:
            deadline = time.monotonic() + 20
            while len(errors) < 2:
                assert time.monotonic() < deadline, "no two failed passes"
                await asyncio.sleep(0.02)
            admin.execute(f"GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance() TO {no_rights_role}")
            while not passes:
                assert time.monotonic() < deadline, "no pass once the role may call it"
                await asyncio.sleep(0.02)
        finally:
            await sweeps.stop()

    asyncio.run(main())
    assert isinstance(errors[0], psycopg.errors.InsufficientPrivilege), repr(errors[0])
    assert "purge_keys" in passes[0]


def test_a_failing_on_pass_or_on_error_never_ends_the_loop():
    heard, errors = threading.Event(), []

    def on_pass(tasks):
        heard.set()
        raise RuntimeError("the callback broke")

    def on_error(exc):
        errors.append(exc)
        raise RuntimeError("so did this one")

    with idem.start_maintenance(ADMIN, interval=0.05, on_pass=on_pass, on_error=on_error):
        wait_for("three reports of the broken callback", lambda: len(errors) >= 3)
    assert heard.is_set() and str(errors[0]) == "the callback broke"


def test_a_connection_that_cannot_be_opened_is_reported_as_a_failed_pass():
    errors = []
    with idem.start_maintenance("user=no_such_role_at_all", interval=0.05, on_error=errors.append):
        wait_for("two failed connections", lambda: len(errors) >= 2)
    assert isinstance(errors[0], psycopg.OperationalError), repr(errors[0])


@pytest.mark.parametrize("interval", [0, -1, 0.0, math.nan, math.inf, None, "5", True])
def test_the_interval_must_be_a_positive_number_of_seconds(interval):
    with pytest.raises(ValueError, match="interval must be a positive number"):
        idem.start_maintenance(ADMIN, interval=interval)

    async def main():
        idem.astart_maintenance(ADMIN, interval=interval)

    with pytest.raises(ValueError, match="interval must be a positive number"):
        asyncio.run(main())


@pytest.mark.parametrize("source", [None, 42, b"user=postgres"])
def test_the_source_is_a_conninfo_or_a_pool(source):
    with pytest.raises(TypeError, match="conninfo string or a connection pool"):
        idem.start_maintenance(source)
