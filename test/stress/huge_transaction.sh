#!/usr/bin/env bash
# One huge transaction: a backfill that enqueues HUGE_EVENTS keyed events
# (8,500,000 by default, past the 8,388,608 records whose list once needed
# more than the 1 GB that one allocation of PostgreSQL may take) over
# HUGE_KEYS keys in one transaction, as `SELECT outbox_enqueue(...) FROM
# generate_series(...)` does. Checks that it commits, that the transaction
# kept at most HUGE_BYTES_PER_EVENT bytes of memory per event until its
# commit (docs/outbox.md says 110 to 120), that each key has exactly one
# head, its first event, and that a claim then hands out, for each key,
# its first events in order. About 3 minutes on 2 cores.
#
# Run as root after the extension is installed; it builds and installs
# nothing. Settings: HUGE_PORT, HUGE_EVENTS, HUGE_KEYS, HUGE_BYTES_PER_EVENT.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${HUGE_PORT:-54412}
events=${HUGE_EVENTS:-8500000}
keys=${HUGE_KEYS:-1000}
bytes_per_event=${HUGE_BYTES_PER_EVENT:-160}

dir=$(mktemp -d /tmp/idempotency-huge.XXXXXX) || exit 1
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

bindir=$(pg_bindir)
psql_db() { as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"; }

failures=0
check() {  # check NAME CONDITION-RESULT(t/f) DETAIL
    if [ "$2" = t ]; then
        echo "ok: $1"
    else
        echo "FAILED: $1 ($3)"
        failures=$((failures + 1))
    fi
}

log "huge transaction: cluster in $dir, port $port"
start_cluster "$dir" "$port" "idempotency.worker_enabled = off" ||
    { cat "$dir/server.log" >&2; exit 1; }
psql_db -c "CREATE EXTENSION idempotency" >/dev/null || exit 1

# The memory is read in the transaction, after the last enqueue and before
# the commit step that checks the keys.
started=$SECONDS
out=$(psql_db -v events="$events" -v keys="$keys" 2>&1 <<'SQL'
BEGIN;
SELECT count(idempotency.outbox_enqueue('backfill', jsonb_build_object('n', i),
                                        key => 'customer-' || (i % :keys)))
  FROM generate_series(1, :events) i \gset
SELECT total_bytes FROM pg_backend_memory_contexts WHERE name = 'TopTransactionContext' \gset
COMMIT;
SELECT 'memory ' || :total_bytes;
SQL
)
rc=$?
echo "$out" | tail -3
log "enqueued $events events over $keys keys in one transaction: $((SECONDS - started)) s"
check "one transaction of $events keyed enqueues commits" "$([ $rc -eq 0 ] && echo t || echo f)" \
    "$(echo "$out" | grep -m1 ERROR)"
memory=$(echo "$out" | sed -n 's/^memory //p')
check "the transaction kept at most $bytes_per_event bytes per event until its commit" \
    "$([ -n "$memory" ] && [ "$memory" -le $((events * bytes_per_event)) ] && echo t || echo f)" \
    "TopTransactionContext: ${memory:-unknown} bytes"
[ -n "$memory" ] && echo "memory until the commit: $memory bytes, $((memory / events)) per event"

check "every event is there" "$(psql_db -c "SELECT count(*) = $events FROM idempotency.outbox")" \
    "$(psql_db -c "SELECT count(*) FROM idempotency.outbox")"
check "each key has exactly one head, its first event" "$(psql_db -c "
    SELECT count(*) = $keys AND bool_and(heads = 1 AND head_id = first_id)
      FROM (SELECT key, count(*) FILTER (WHERE ready_at IS NOT NULL) heads,
                   min(id) FILTER (WHERE ready_at IS NOT NULL) head_id, min(id) first_id
              FROM idempotency.outbox GROUP BY key) k")" \
    "$(psql_db -c "SELECT count(*) FROM idempotency.outbox WHERE ready_at IS NOT NULL") heads"
# Event n went to key customer-(n % keys), in n's order: a key's k-th
# event is n = first + (k - 1) * keys, where first is its smallest n.
check "a claim hands out each key's first events, in order" "$(psql_db -c "
    WITH claimed AS (
        SELECT key, (payload->>'n')::int8 AS n,
               row_number() OVER (PARTITION BY key ORDER BY id) AS k
          FROM idempotency.outbox_claim('backfill-relay', 1000))
    SELECT count(*) = 1000
           AND bool_and(n = (CASE WHEN n % $keys = 0 THEN $keys ELSE n % $keys END) + (k - 1) * $keys)
      FROM claimed")" \
    "a key handed out an event that is not its next"
check "no error in the server log" \
    "$(grep -qE 'ERROR|FATAL|PANIC|terminated by signal' "$dir/server.log" && echo f || echo t)" \
    "$(grep -m3 -E 'ERROR|FATAL|PANIC|terminated by signal' "$dir/server.log")"

echo "huge transaction: $((SECONDS - started)) s, $failures failed"
[ "$failures" -eq 0 ]
