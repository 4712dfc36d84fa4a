#!/usr/bin/env bash
# The fastapi example end to end: a throwaway cluster, the Python client
# installed into a virtual environment (pip, offline), then scenario.py,
# which runs the API under uvicorn on a Unix socket: concurrent duplicates,
# replays, a key reused with another body, refused transfers, a server
# killed before its commit and retried after a restart, and the proof in
# the database that each transfer was applied exactly once. Exits non-zero
# on any failure. Needs the extension installed (make install) and Debian's
# python3-fastapi, python3-uvicorn, python3-httpx, python3-psycopg(-pool).
# Settings: FASTAPI_PORT (54465, names the cluster's socket), EXAMPLE_KEEP=1
# keeps the cluster's folder when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

example_start fastapi "${FASTAPI_PORT:-54465}" ledger
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
python=$(example_python) || example_fail "could not install the Python client"
mkdir -p "$EXAMPLE_DIR/scratch"
EXAMPLE_LOGS+=("$EXAMPLE_DIR/scratch/api.log")
example_run "$python" "$here/scenario.py" --admin-dsn "host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=postgres" \
    --workdir "$EXAMPLE_DIR/scratch" || example_fail "fastapi checks failed"
echo "fastapi: all checks passed"
