#!/usr/bin/env bash
# The consumer example end to end: a throwaway cluster, then loadtest.py:
# 2,000 messages delivered 10,000 times and more (producer retries,
# rebalances, crashed consumers) to 4 consumer processes, and the proof
# that each took effect once. Exits non-zero on any failure.
# Needs the extension installed (make install) and python3-psycopg2.
# Settings: CONSUMER_PORT (54462, names the cluster's socket), EXAMPLE_KEEP=1
# keeps the cluster's folder when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

example_start consumer "${CONSUMER_PORT:-54462}" loyalty "max_connections = 50"
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
# The consumer's role has what the README says: the application's rights only.
example_sql -d "$PGDATABASE" >/dev/null <<'SQL' || example_fail "setup failed"
SELECT idempotency.revoke_role('app');
SELECT idempotency.grant_application('app');
SQL

mkdir -p "$EXAMPLE_DIR/work"
dsn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=app"
admin_dsn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=postgres"
example_run /usr/bin/python3 "$here/loadtest.py" --dsn "$dsn" --admin-dsn "$admin_dsn" \
    --workdir "$EXAMPLE_DIR/work" --timeout 240 || example_fail "consumer checks failed"
echo "consumer: all checks passed"
