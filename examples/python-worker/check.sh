#!/usr/bin/env bash
# The python-worker example end to end: a throwaway cluster, then
# scenario.py: invoice e-mail jobs through the outbox, workers (one killed
# mid-send), a scripted provider on 127.0.0.1, and checks of the final
# states: stored results replayed to duplicates, retryable failures retried
# after backoff, final failures in the dead letters. Exits non-zero on any
# failure. Needs the extension installed (make install), python3-psycopg and
# python3-psycopg2 (the scenario's own checks); the Python client is installed
# into a virtual environment with pip, offline.
# Settings: PYTHON_WORKER_PORT (54463, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

example_start python-worker "${PYTHON_WORKER_PORT:-54463}" billing
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
# Quick retries for the scenario: 3 attempts, backoff from 300 ms. The
# on-call role reads the extension's views through pg_monitor, and may look
# up the keys of the dead jobs it lists.
example_sql -d billing >/dev/null <<'SQL' || example_fail "setup failed"
-- The worker's role has what the README says, and no more: the
-- application's rights and the relay's for its topic (Consumer).
SELECT idempotency.revoke_role('app');
SELECT idempotency.grant_application('app');
SELECT idempotency.grant_relay('app', topics => '{invoice.email}');
ALTER DATABASE billing SET idempotency.max_attempts = 3;
ALTER DATABASE billing SET idempotency.retry_base_delay = '300ms';
ALTER DATABASE billing SET idempotency.retry_max_delay = '2s';
CREATE ROLE oncall LOGIN IN ROLE pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.idem_get(text, text) TO oncall;
SQL

python=$(example_python) || example_fail "could not install the Python client"
mkdir -p "$EXAMPLE_DIR/scratch"
conn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE"
EXAMPLE_LOGS+=("$EXAMPLE_DIR"/scratch/worker-{1,2,3}.log)
example_run "$python" "$here/scenario.py" --dsn "$conn user=app" --ops-dsn "$conn user=oncall" \
    --admin-dsn "$conn user=postgres" --workdir "$EXAMPLE_DIR/scratch" || example_fail "python-worker checks failed"
echo "python-worker: all checks passed"
