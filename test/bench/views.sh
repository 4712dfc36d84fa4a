#!/usr/bin/env bash
# What the monitoring views cost as history grows: idem_stuck, idem_stats
# and outbox_lag timed (median of BENCH_VIEWS_RUNS reads) with
# BENCH_VIEWS_SMALL (1000000) and then BENCH_VIEWS_KEYS (10000000) finished
# keys and BENCH_VIEWS_EVENTS (1000000) delivered events, beside 2000
# PROCESSING keys, 100 RECEIVED keys and a live queue on 10 topics, made
# through the extension's functions. The finished rows are loaded directly
# (as a restore would), so the counts are recounted first (request_sweep();
# the time of that recount is reported). The 0.5.0 definitions of the views
# (scans of the whole tables) are timed on the same rows, and the plans of
# the current ones are printed with their buffer counts: no scan of the
# finished rows. Prints Markdown on stdout.
#
# Environment: BENCH_VIEWS_KEYS, BENCH_VIEWS_SMALL, BENCH_VIEWS_EVENTS,
# BENCH_VIEWS_RUNS (21), BENCH_VIEWS_PORT (54434). Run by `make bench`
# (section views) or alone; the load of 10,000,000 keys takes some minutes.
set -u
. "$(dirname "$0")/../lib/common.sh"

keys=${BENCH_VIEWS_KEYS:-10000000}
small=${BENCH_VIEWS_SMALL:-1000000}
events=${BENCH_VIEWS_EVENTS:-1000000}
runs=${BENCH_VIEWS_RUNS:-21}
port=${BENCH_VIEWS_PORT:-54434}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-views.XXXXXX")
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# The workers off: nothing purges or settles behind the measurements.
start_cluster "$dir" "$port" "shared_buffers = 512MB" "max_wal_size = 8GB" "max_connections = 50" \
    "idempotency.worker_enabled = off" "autovacuum = off" ||
    { cat "$dir/server.log" >&2; exit 1; }

psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
psql_bench -c "CREATE EXTENSION idempotency" || exit 1

# The live part, through the functions: 2000 PROCESSING keys (100 of them
# with a lease already over), 100 RECEIVED, 2000 undelivered events on 10
# topics (200 in flight), 20 dead. (The counts it prints are not part of
# the report.)
psql_bench >/dev/null <<'SQL' || exit 1
SELECT count(idempotency.idem_claim('live-' || n, lease => CASE WHEN n <= 100 THEN interval '1ms' ELSE interval '1 hour' END,
                                    scope => 's' || n % 10))
  FROM generate_series(1, 2000) n;
SELECT count(idempotency.idem_register('waiting-' || n, scope => 's' || n % 10)) FROM generate_series(1, 100) n;
SELECT count(idempotency.outbox_enqueue('t' || n % 10, jsonb_build_object('n', n), 'k' || n % 500))
  FROM generate_series(1, 2000) n;
BEGIN;
SELECT count(*) FROM idempotency.outbox_claim('relay', 200, '1 hour');
COMMIT;
SELECT count(idempotency.outbox_enqueue('dead', jsonb_build_object('n', n))) FROM generate_series(1, 20) n;
SELECT count(idempotency.outbox_nack(id, 'gone', false))
  FROM idempotency.outbox_claim('relay', 20, '1 hour', '{dead}');
SQL

# Finished rows, loaded in chunks: keys COMPLETED (9 in 10) or FAILED_FINAL
# over 10 scopes, events delivered over the 10 topics.
load_keys() {  # load_keys FROM TO
    local from=$1 to=$2 next
    while [ "$from" -lt "$to" ]; do
        next=$((from + 1000000 < to ? from + 1000000 : to))
        psql_bench -c "
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at, purge_at)
SELECT 's' || g % 10, 'done-' || g, CASE WHEN g % 10 = 0 THEN 'FAILED_FINAL' ELSE 'COMPLETED' END::idempotency.idem_status,
       g, 1, '{\"status\": 200, \"order\": 42}', now(), now(), now(), now() + interval '10 years',
       now() + interval '10 years'
  FROM generate_series($((from + 1)), $next) g" || return 1
        from=$next
    done
}
load_events() {  # load_events COUNT
    psql_bench -c "
INSERT INTO idempotency.outbox (topic, key, payload, state, attempts, enqueued_at, available_at,
                                delivered_at, updated_at, relay)
SELECT 't' || g % 10, 'k' || g % 500, jsonb_build_object('n', g), 'delivered', 1, now(), now(), now(), now(),
       'relay'
  FROM generate_series(1, $1) g"
}

# The views' 0.5.0 definitions, run as queries on the same tables.
old_stats="SELECT k.scope, count(*) FILTER (WHERE k.status = 'RECEIVED') AS received,
  count(*) FILTER (WHERE k.status = 'PROCESSING') AS processing,
  count(*) FILTER (WHERE k.status = 'COMPLETED') AS completed,
  count(*) FILTER (WHERE k.status = 'FAILED_RETRYABLE') AS failed_retryable,
  count(*) FILTER (WHERE k.status = 'FAILED_FINAL') AS failed_final,
  count(*) FILTER (WHERE (k.status = 'PROCESSING' AND (k.lease_until < n.now OR k.updated_at < n.stuck_before))
                      OR (k.status = 'RECEIVED' AND k.updated_at < n.stuck_before)) AS stuck,
  n.now - min(k.updated_at) FILTER (WHERE k.status = 'PROCESSING') AS oldest_processing_age
  FROM idempotency.idempotency_keys k,
       (SELECT clock_timestamp() AS now, clock_timestamp() - idempotency.stuck_after() AS stuck_before) n
 GROUP BY k.scope, n.now"
old_stuck="SELECT k.* FROM idempotency.idempotency_keys k,
       (SELECT clock_timestamp() AS now, clock_timestamp() - idempotency.stuck_after() AS stuck_before) n
 WHERE (k.status = 'PROCESSING' AND (k.lease_until < n.now OR k.updated_at < n.stuck_before))
    OR (k.status = 'RECEIVED' AND k.updated_at < n.stuck_before)"
old_lag="SELECT o.topic, count(*) FILTER (WHERE o.state = 'pending' AND o.attempts = 0) AS pending,
  count(*) FILTER (WHERE o.state = 'in_flight' AND o.lease_until > n.now) AS in_flight,
  count(*) FILTER (WHERE (o.state = 'pending' AND o.attempts > 0) OR (o.state = 'in_flight' AND o.lease_until <= n.now)) AS retrying,
  count(*) FILTER (WHERE o.state = 'dead') AS dead,
  min(o.enqueued_at) FILTER (WHERE o.state IN ('pending', 'in_flight')) AS oldest_pending_at,
  max(o.delivered_at) AS last_delivered_at
  FROM idempotency.outbox o, (SELECT clock_timestamp() AS now) n GROUP BY o.topic, n.now"

psql_bench <<'SQL' || exit 1
CREATE FUNCTION bench_median_ms(query text, runs int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    times float8[] := '{}';
BEGIN
    FOR i IN 1..runs LOOP
        t0 := clock_timestamp();
        EXECUTE 'SELECT count(*) FROM (' || query || ') v';
        times := times || (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
    END LOOP;
    RETURN (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(times) t);
END $$;
SQL

median() {  # median QUERY RUNS
    psql_bench -v q="$1" <<<"SELECT round(bench_median_ms(:'q', $2)::numeric, 2)"
}
rows_of() { psql_bench -c "SELECT count(*) FROM idempotency.$1"; }

# Loads up to a size, recounts, then times every view: one table row each.
declare -A timed
measure_at() {  # measure_at KEYS
    local size=$1 t0 t1 view
    t0=$(date +%s.%N)
    psql_bench -c "SELECT idempotency.request_sweep()" \
        -c "SELECT count(*) FROM idempotency.key_counts()" >/dev/null || return 1
    t1=$(date +%s.%N)
    timed[recount_$size]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    psql_bench -c "ANALYZE idempotency.idempotency_keys" -c "ANALYZE idempotency.outbox" || return 1
    for view in idem_stuck idem_stats outbox_lag; do
        timed[${view}_$size]=$(median "SELECT * FROM idempotency.$view" "$runs")
    done
    timed[old_stuck_$size]=$(median "$old_stuck" 3)
    timed[old_stats_$size]=$(median "$old_stats" 3)
    timed[old_lag_$size]=$(median "$old_lag" 3)
}

log "views: loading $small finished keys and $events delivered events"
load_keys 0 "$small" && load_events "$events" || exit 1
measure_at "$small" || exit 1
log "views: loading up to $keys finished keys"
load_keys "$small" "$keys" || exit 1
measure_at "$keys" || exit 1

fmt() { printf "%'d" "$1"; }
echo "Rows: $(fmt "$(rows_of idempotency_keys)") keys (2,000 PROCESSING, 100 RECEIVED), $(fmt "$(rows_of outbox)") events ($(fmt "$events") delivered); medians of $runs reads, ms."
echo
echo "| view | $(fmt "$small") finished keys | $(fmt "$keys") finished keys | ratio | 0.5.0 definition, $(fmt "$small") | 0.5.0 definition, $(fmt "$keys") |"
echo "|---|---:|---:|---:|---:|---:|"
for pair in "idem_stuck old_stuck" "idem_stats old_stats" "outbox_lag old_lag"; do
    set -- $pair
    awk -v v="$1" -v a="${timed[$1_$small]}" -v b="${timed[$1_$keys]}" -v oa="${timed[$2_$small]}" \
        -v ob="${timed[$2_$keys]}" 'BEGIN { printf "| `%s` | %.2f | %.2f | %.2f | %.0f | %.0f |\n", v, a, b, b / a, oa, ob }'
done
echo
echo "The recount after the load (request_sweep(), then the first read counts the tables): ${timed[recount_$small]} s with $(fmt "$small") keys, ${timed[recount_$keys]} s with $(fmt "$keys")."
for view in idem_stuck idem_stats outbox_lag; do
    echo
    echo "Plan of \`$view\` with $(fmt "$keys") finished keys:"
    echo
    echo '```'
    psql_bench -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY OFF) SELECT * FROM idempotency.$view"
    echo '```'
done
