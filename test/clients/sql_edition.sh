#!/usr/bin/env bash
# The client libraries' suites (node.sh, python.sh, go.sh beside this file)
# against the SQL edition (src/sql_edition/, docs/managed-postgres.md): the
# same tests on a cluster without the library preloaded and a database with
# CREATE EXTENSION idempotency_sql (IDEM_EDITION=sql, examples/lib/example.sh).
# A test that covers what only the C++ extension has skips itself there,
# naming the reason (the scopes' retry_after estimates; the databases of
# the C++ extension's older versions). Exits non-zero when a suite fails.
# Ports: CLIENTS_SQL_NODE_PORT (54474), CLIENTS_SQL_PYTHON_PORT (54475),
# CLIENTS_SQL_GO_PORT (54476).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
failed=()
IDEM_EDITION=sql CLIENTS_NODE_PORT=${CLIENTS_SQL_NODE_PORT:-54474} bash "$here/node.sh" || failed+=(node)
IDEM_EDITION=sql CLIENTS_PYTHON_PORT=${CLIENTS_SQL_PYTHON_PORT:-54475} bash "$here/python.sh" || failed+=(python)
IDEM_EDITION=sql CLIENTS_GO_PORT=${CLIENTS_SQL_GO_PORT:-54476} bash "$here/go.sh" || failed+=(go)
if [ ${#failed[@]} -ne 0 ]; then
    echo "clients against the SQL edition: ${failed[*]} failed" >&2
    exit 1
fi
echo "clients against the SQL edition: node, python and go passed"
