#!/usr/bin/env bash
# Growth of the keys table to BENCH_GROWTH_STEPS finished keys (by default
# 10,000, 1,000,000, 5,000,000 and 20,000,000), keys uniformly random (an
# md5 of a number, spread over the whole primary key as real request ids
# are), on a server with PostgreSQL's default memory and checkpoint
# settings, so that the table outgrows shared_buffers. At each step, after
# a VACUUM ANALYZE and a checkpoint, side by side in one run:
#   - bytes per key at rest: the table with its indexes, and the heap alone;
#   - duplicates: idem_claim of a random loaded key (its stored result
#     replayed), transactions a second;
#   - new keys: idem_claim + idem_complete of a new random key in one
#     transaction, transactions a second, and the WAL each writes (the
#     WAL position before and after the run, over its transactions);
#     then, after another checkpoint, the same with wal_compression = lz4
#     (a superuser's session setting) for the WAL a compressed page image
#     saves.
# Each figure also as a ratio to the first step. Prints Markdown on stdout.
# Targets (issue: growth at scale): at rest <= 200 B per finished key;
# duplicates at the last step >= 0.85x the first; WAL per new key at the
# last step <= 2x the first.
#
# The keys are loaded directly (a restore's way), a million per statement,
# each million sorted by key: the load then reads the primary key's pages
# in order instead of at random, and still splits and fills them as
# random inserts do.
#
# Environment: BENCH_GROWTH_STEPS, BENCH_GROWTH_SECONDS (20) per pgbench run,
# BENCH_GROWTH_CLIENTS (4), BENCH_GROWTH_PORT (54439). Run by `make bench`
# (section growth) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

steps=${BENCH_GROWTH_STEPS:-"10000 1000000 5000000 20000000"}
seconds=${BENCH_GROWTH_SECONDS:-20}
clients=${BENCH_GROWTH_CLIENTS:-4}
port=${BENCH_GROWTH_PORT:-54439}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-growth.XXXXXX")
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "max_connections = 50" || { cat "$dir/server.log" >&2; exit 1; }
psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}
psql_bench -c "CREATE EXTENSION idempotency" || exit 1

# A finished key as idem_complete leaves it after a claim with a request:
# its fingerprint, its stored result, and a purge far away.
load() {  # load FROM TO: keys md5(FROM+1) .. md5(TO)
    psql_bench -c "
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, fingerprint, result, created_at, updated_at,
   completed_at, claimed_at, expires_at, purge_at)
SELECT 'default', md5(g::text), 'COMPLETED', g, 1, sha256(g::text::bytea),
       jsonb_build_object('status', 200, 'order', g, 'ok', true), now(), now(), now(), now(),
       now() + interval '10 years', now() + interval '10 years'
  FROM generate_series($(($1 + 1)), $2) g ORDER BY md5(g::text)"
}

# The two workloads, as pgbench scripts: :loaded is the keys loaded.
printf '%s\n' '\set i random(1, :loaded)' \
    "SELECT outcome FROM idempotency.idem_claim(md5(:i::text), NULL, interval '30 seconds') WHERE outcome = 'completed' \gset" \
    >"$dir/duplicate.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
    "SELECT token FROM idempotency.idem_claim(md5('new-' || :client_id || '-' || :r), NULL, interval '30 seconds') \gset" \
    "SELECT idempotency.idem_complete(md5('new-' || :client_id || '-' || :r), :token, '{\"status\": 200}');" \
    >"$dir/new_key.sql"
chmod 644 "$dir"/*.sql

# run SCRIPT LOADED [PGOPTIONS]: "tps transactions"
run() {
    as_pg env PGOPTIONS="${3:-}" "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c "$clients" -j 2 -M prepared \
        -T "$seconds" -D loaded="$2" -f "$dir/$1.sql" postgres >"$dir/$1.log" 2>&1 ||
        { tail -5 "$dir/$1.log" >&2; return 1; }
    echo "$(sed -nE 's/^tps = ([0-9.]+) \(without.*/\1/p' "$dir/$1.log")" \
        "$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$dir/$1.log")"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

rows=()
loaded=0
first=
for step in $steps; do
    log "growth: loading up to $step keys"
    while [ "$loaded" -lt "$step" ]; do
        next=$((loaded + 1000000 < step ? loaded + 1000000 : step))
        load "$loaded" "$next" || exit 1
        loaded=$next
    done
    psql_bench -c "VACUUM ANALYZE idempotency.idempotency_keys" -c "CHECKPOINT" >/dev/null || exit 1
    read -r keys total heap < <(psql_bench -F ' ' -c "SELECT count(*),
        pg_total_relation_size('idempotency.idempotency_keys'),
        pg_relation_size('idempotency.idempotency_keys') FROM idempotency.idempotency_keys")
    log "growth: $keys keys: duplicates"
    read -r dup_tps _ < <(run duplicate "$loaded") || exit 1
    psql_bench -c "CHECKPOINT" >/dev/null || exit 1
    log "growth: $keys keys: new keys"
    before=$(psql_bench -c "SELECT pg_current_wal_insert_lsn()")
    read -r new_tps new_count < <(run new_key "$loaded") || exit 1
    wal=$(psql_bench -c "SELECT (pg_current_wal_insert_lsn() - '$before'::pg_lsn) / greatest($new_count, 1)")
    psql_bench -c "CHECKPOINT" >/dev/null || exit 1
    log "growth: $keys keys: new keys, wal_compression = lz4"
    before=$(psql_bench -c "SELECT pg_current_wal_insert_lsn()")
    read -r _ lz4_count < <(run new_key "$loaded" "-c wal_compression=lz4") || exit 1
    wal_lz4=$(psql_bench -c "SELECT (pg_current_wal_insert_lsn() - '$before'::pg_lsn) / greatest($lz4_count, 1)")
    per_key=$((total / keys))
    heap_per_key=$((heap / keys))
    wal=$(printf '%.0f' "$wal")
    wal_lz4=$(printf '%.0f' "$wal_lz4")
    [ -z "$first" ] && first="$dup_tps $new_tps $wal $wal_lz4"
    read -r dup0 new0 wal0 lz40 <<<"$first"
    rows+=("| $keys | $per_key B | $heap_per_key B | $(printf '%.0f' "$dup_tps") | $(ratio "$dup_tps" "$dup0") | $(printf '%.0f' "$new_tps") | $(ratio "$new_tps" "$new0") | $wal B | $(ratio "$wal" "$wal0") | $wal_lz4 B | $(ratio "$wal_lz4" "$lz40") |")
done

echo "| finished keys | bytes per key (with indexes) | heap bytes per key | duplicates/s | ratio | new keys/s | ratio | WAL per new key | ratio | WAL per new key, wal_compression = lz4 | ratio |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "Uniformly random keys, loaded directly; $clients pgbench clients, $seconds s a run, a checkpoint" \
    "before each run; PostgreSQL's default shared_buffers ($(psql_bench -c 'SHOW shared_buffers')) and" \
    "checkpoint settings. Ratios to the first step. The lz4 column: the new keys run again after" \
    "another checkpoint, with wal_compression = lz4 in the clients' sessions."
echo "Targets: <= 200 B per finished key at rest; duplicates at the last step >= 0.85x the first;" \
    "WAL per new key at the last step <= 2x the first."
