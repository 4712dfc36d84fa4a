#!/usr/bin/env bash
# The node-api example end to end: a throwaway cluster, `npm ci`, the API
# (server.js, Express and the client's middleware) and two workers (worker.js,
# the client's consume and claim) on loopback, then scenario.js:
# requests with and without Idempotency-Key, concurrent duplicates, a key
# reused with another body, replays, and the proof in the database that each
# payment was applied exactly once. Exits non-zero on any failure.
# Needs the extension installed (make install); builds nothing.
# Settings: NODE_API_PORT (54461, names the cluster's socket), EXAMPLE_KEEP=1
# keeps the cluster's folder when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

example_start node-api "${NODE_API_PORT:-54461}" shop
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
logs=$EXAMPLE_DIR

log "node-api: npm ci"
example_run timeout 300 npm ci --prefix "$here" --no-audit --no-fund --loglevel=error >"$logs/npm.log" 2>&1 ||
    { cat "$logs/npm.log" >&2; example_fail "npm ci failed"; }

log "node-api: starting the API and two workers"
PORT=0 PORT_FILE="$logs/api.port" example_bg "$logs/api.log" node "$here/server.js"
api_pid=${EXAMPLE_PIDS[-1]}
worker_pids=()
# Short leases so that the slow bank call (3 s) needs heartbeats; 2 slots each.
for n in 1 2; do
    WORKER_NAME=worker-$n CONCURRENCY=2 LEASE_SECONDS=2 LOCK_WAIT_SECONDS=30 POLL_MS=500 \
        example_bg "$logs/worker-$n.log" node "$here/worker.js"
    worker_pids+=("${EXAMPLE_PIDS[-1]}")
done
example_wait_for 20 test -s "$logs/api.port" || example_fail "the API did not start"
example_wait_for 20 grep -q started "$logs/worker-1.log" || example_fail "worker-1 did not start"
example_wait_for 20 grep -q started "$logs/worker-2.log" || example_fail "worker-2 did not start"

API_URL="http://127.0.0.1:$(cat "$logs/api.port")/api/payments" PGADMIN_USER=postgres \
    example_run timeout 180 node "$here/scenario.js"
status=$?

# The workers and the API stop cleanly on SIGTERM.
for pid in "$api_pid" "${worker_pids[@]}"; do
    example_stop "$pid" 10 || { echo "not ok - process $pid did not exit 0 on SIGTERM" >&2; status=1; }
done
[ "$status" -eq 0 ] || example_fail "node-api checks failed"
echo "node-api: all checks passed"
