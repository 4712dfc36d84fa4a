#!/usr/bin/env bash
# A retention purge of BENCH_PURGE_KEYS (10000000) expired keys by the
# background worker while clients claim and complete new keys: the claim +
# complete latency (p50, p99) before the purge (workers off), during it and
# after it, the purge's duration, how late a 5 s lease that ends during the
# purge is expired, and the sequential scans of idempotency_keys in each
# phase (the sweeps find their rows through indexes, whatever the
# statistics say). Prints Markdown on stdout.
#
# Environment: BENCH_PURGE_KEYS (10000000), BENCH_PURGE_CLIENTS (8),
# BENCH_PURGE_BEFORE (20) and BENCH_PURGE_AFTER (60) seconds of load around
# the purge, BENCH_PURGE_PORT (54432). Run by `make bench` (section purge)
# or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

keys=${BENCH_PURGE_KEYS:-10000000}
clients=${BENCH_PURGE_CLIENTS:-8}
before_s=${BENCH_PURGE_BEFORE:-20}
after_s=${BENCH_PURGE_AFTER:-60}
port=${BENCH_PURGE_PORT:-54432}
chunk_s=5

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d /tmp/idempotency-purge.XXXXXX)
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 256MB" "synchronous_commit = on" \
    "max_wal_size = 4GB" "max_connections = 100" "idempotency.worker_enabled = off" ||
    { cat "$dir/server.log" >&2; exit 1; }

psql_purge() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}
now_epoch() { psql_purge -c "SELECT extract(epoch FROM clock_timestamp())"; }
seq_scans() {
    psql_purge -c "SELECT pg_stat_force_next_flush()" \
        -c "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass" |
        tail -n 1
}
deleted() {
    psql_purge -c "SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass"
}

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
psql_purge -c "CREATE EXTENSION idempotency" || exit 1

log "purge: loading $keys expired keys"
t0=$(date +%s)
loaded=0
while [ "$loaded" -lt "$keys" ]; do
    next=$((loaded + 1000000 < keys ? loaded + 1000000 : keys))
    psql_purge -c "
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at, purge_at)
SELECT 'load', 'expired-' || g, 'COMPLETED', g, 1, '{\"status\": 200, \"order\": 42}',
       now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
       now() - interval '1 day', now() - interval '1 day'
  FROM generate_series($((loaded + 1)), $next) g" || exit 1
    loaded=$next
done
# Statistics taken now say every row is due: what a sweep must not believe.
psql_purge -c "CHECKPOINT" -c "ANALYZE idempotency.idempotency_keys" || exit 1
size=$(psql_purge -c "SELECT pg_size_pretty(pg_total_relation_size('idempotency.idempotency_keys'))")
log "purge: loaded in $(($(date +%s) - t0)) s, $size"

cat >"$dir/claim.sql" <<'EOF'
\set k random(1, 1000000000000)
BEGIN;
SELECT outcome, token FROM idempotency.idem_claim('bench-' || :k, NULL, interval '30 seconds') \gset
SELECT outcome FROM idempotency.idem_complete('bench-' || :k, :token, '{"status": 200}') \gset
COMMIT;
EOF
chown "$IDEM_OS_USER" "$dir/claim.sql"
mkdir -p "$dir/logs" && chown "$IDEM_OS_USER" "$dir/logs"

# Load in chunks of $chunk_s seconds, each logging every transaction, until
# the file $dir/stop appears.
run_load() {
    local n=0
    while [ ! -e "$dir/stop" ]; do
        n=$((n + 1))
        (cd "$dir/logs" && as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n \
            -c "$clients" -j 2 -T "$chunk_s" -f "$dir/claim.sql" -l --log-prefix="chunk$n" bench \
            >>"$dir/pgbench.out" 2>&1)
    done
}

run_load &
load_pid=$!
sleep 2
t_before=$(now_epoch)
scans_before=$(seq_scans)
sleep "$before_s"

log "purge: workers on"
scans_start=$(seq_scans)
t_start=$(now_epoch)
psql_purge -c "ALTER SYSTEM SET idempotency.worker_enabled = on" -c "SELECT pg_reload_conf()" >/dev/null
psql_purge -c "SELECT 1 FROM idempotency.idem_claim('probe', NULL, interval '5 seconds')" >/dev/null
probe_delay=""
t_end=""
deadline=$(($(date +%s) + 3600))
while [ "$(date +%s)" -lt "$deadline" ] && [ -z "$t_end" ] || [ -z "$probe_delay" ]; do
    [ "$(date +%s)" -ge "$deadline" ] && break
    if [ -z "$probe_delay" ]; then
        probe_delay=$(psql_purge -c "SELECT round(extract(epoch FROM updated_at - (claimed_at + interval '5 seconds'))::numeric, 2)
            FROM idempotency.idempotency_keys
            WHERE scope = 'default' AND key = 'probe' AND status <> 'PROCESSING'")
    fi
    if [ -z "$t_end" ] && [ "$(deleted)" -ge "$keys" ]; then t_end=$(now_epoch); fi
    sleep 0.5
done
[ -n "$t_end" ] || t_end=$(now_epoch)
scans_end=$(seq_scans)
log "purge: done in $(awk -v a="$t_start" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }') s"
sleep "$after_s"
t_after=$(now_epoch)
scans_after=$(seq_scans)
touch "$dir/stop"
wait "$load_pid"

# pgbench log lines: client transaction latency_us script epoch_s epoch_us.
phase_row() {  # phase_row LABEL FROM TO SCANS
    cat "$dir"/logs/chunk* | awk -v from="$2" -v to="$3" \
        '{ t = $5 + $6 / 1e6; if (t >= from && t < to) print $3 / 1000 }' | sort -n |
        awk -v label="$1" -v secs="$(awk -v a="$2" -v b="$3" 'BEGIN { print b - a }')" -v scans="$4" '
            { v[NR] = $1 }
            END {
                if (NR == 0) { printf "| %s | %.0f | - | - | - | %s |\n", label, secs, scans; exit }
                p50 = v[int(NR * 0.50 + 0.999999)]; p99 = v[int(NR * 0.99 + 0.999999)]
                printf "| %s | %.0f | %.0f | %.1f | %.1f | %s |\n", label, secs, NR / secs, p50, p99, scans
            }'
}

analyzed=$(psql_purge -c "SELECT coalesce(round(extract(epoch FROM last_analyze) - $t_start), -1) || '|' ||
    coalesce(round(extract(epoch FROM last_autovacuum) - $t_start), -1)
    FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass")
IFS='|' read -r analyze_at autovacuum_at <<<"$analyzed"
purge_s=$(awk -v a="$t_start" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')

echo "$keys expired keys ($size with indexes) purged by the worker in $purge_s s" \
    "($(awk -v n="$keys" -v s="$purge_s" 'BEGIN { printf "%.0f", n / s }') keys/s) while $clients clients" \
    "claim and complete new keys (one transaction each). A 5 s lease claimed when the purge started" \
    "was expired ${probe_delay:-?} s after its end."
echo
echo "| phase | seconds | claim + complete per second | p50 ms | p99 ms | sequential scans of idempotency_keys |"
echo "|---|---:|---:|---:|---:|---:|"
phase_row "before (workers off)" "$t_before" "$t_start" $((scans_start - scans_before))
phase_row "during the purge" "$t_start" "$t_end" $((scans_end - scans_start))
phase_row "after it" "$t_end" "$t_after" $((scans_after - scans_end))
echo
echo "ANALYZE of idempotency_keys $( [ "$analyze_at" -ge 0 ] && echo "${analyze_at} s after the purge started" || echo "not run")," \
    "autovacuum $( [ "$autovacuum_at" -ge 0 ] && echo "${autovacuum_at} s after it" || echo "not yet")." \
    "Settings: idempotency.purge_batch = $(psql_purge -c 'SHOW idempotency.purge_batch')," \
    "idempotency.purge_pause = $(psql_purge -c 'SHOW idempotency.purge_pause')."
