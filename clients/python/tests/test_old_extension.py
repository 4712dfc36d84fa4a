"""Against a database whose extension is still 0.6.0 (the harness makes it:
OLD_DATABASE): a client upgraded before ALTER EXTENSION ... UPDATE keeps
working, without the answers 0.7.0 added (result_expired, steps)."""

import os
import uuid

import psycopg
import pytest

import pg_idempotency as idem
from conftest import SETTINGS

DATABASE = os.environ.get("OLD_DATABASE")
pytestmark = pytest.mark.skipif(
    not DATABASE, reason="the SQL edition has no version before 0.7.0 to be left on"
    if os.environ.get("IDEM_EDITION") == "sql" else "OLD_DATABASE is not set")


def test_runs_once_and_replays_on_0_6_0():
    with psycopg.connect(dbname=DATABASE, options=SETTINGS) as conn:
        version = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]
        assert version == "0.6.0"
        key, runs = f"old-{uuid.uuid4()}", []
        for _ in range(2):
            job = idem.run_once(conn, key, lambda job: runs.append(job.attempt) or {"sent": 1}, {"n": 1})
        assert runs == [1]
        assert (job.outcome, job.result, job.replayed, job.result_expired) == ("completed", {"sent": 1}, True, False)
        assert job.steps == {}
