#!/usr/bin/env bash
# Bytes per finished key at rest, as a full row (its result kept) and as a
# tombstone (its result's retention passed): BENCH_TOMBSTONE_KEYS finished
# keys (1,000,000), uniformly random (an md5 of a number), loaded directly
# as growth.sh loads them, then moved into tombstones by the purge itself
# (idem_maintenance(), in batches of 100,000). After a VACUUM ANALYZE and a
# checkpoint each form is measured: the table with its indexes, the heap,
# and each index. Target (issue: two-tier retention): about 100 B per
# tombstone with its index entry, whatever the key's length (a tombstone
# keeps a 16-byte digest of scope and key, not the key). Prints Markdown on stdout.
#
# Environment: BENCH_TOMBSTONE_KEYS, BENCH_TOMBSTONE_PORT (54441). Run by
# `make bench` (section tombstones) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

keys=${BENCH_TOMBSTONE_KEYS:-1000000}
port=${BENCH_TOMBSTONE_PORT:-54441}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-tombstones.XXXXXX")
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "idempotency.worker_enabled = off" "idempotency.purge_batch = 100000" ||
    { cat "$dir/server.log" >&2; exit 1; }
psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}
psql_bench -c "CREATE EXTENSION idempotency" || exit 1

# Finished keys as idem_complete leaves them after a claim with a request
# (a fingerprint and a small stored result), due for the purge.
log "tombstones: loading $keys finished keys"
psql_bench -c "
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, fingerprint, result, created_at, updated_at,
   completed_at, claimed_at, expires_at, purge_at)
SELECT 'default', md5(g::text), 'COMPLETED', g, 1, sha256(g::text::bytea),
       jsonb_build_object('status', 200, 'order', g, 'ok', true), now(), now(), now(), now(),
       now() - interval '1 second', now() - interval '1 second'
  FROM generate_series(1, $keys) g ORDER BY md5(g::text)" || exit 1

# measure TABLE: "rows total heap indexes..." (indexes as name=bytes)
measure() {
    psql_bench -c "VACUUM ANALYZE $1" -c "CHECKPOINT" >/dev/null || exit 1
    psql_bench -F ' ' -c "SELECT (SELECT count(*) FROM $1), pg_total_relation_size('$1'),
        pg_relation_size('$1'),
        (SELECT string_agg(i.indexrelid::regclass::text || '=' || pg_relation_size(i.indexrelid), ' '
                           ORDER BY i.indexrelid::regclass::text)
           FROM pg_index i WHERE i.indrelid = '$1'::regclass)"
}
per() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b > 0 ? a / b : 0) }'; }
per_million() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f MiB", (b > 0 ? a / b * 1e6 / 1048576 : 0) }'; }
indexes_per_key() {  # "name=bytes ..." ROWS
    local out="" part
    for part in $1; do out+="${part%%=*}: $(per "${part#*=}" "$2") B; "; done
    echo "${out%; }"
}

read -r full_rows full_total full_heap full_indexes < <(measure idempotency.idempotency_keys)
log "tombstones: the purge moves them"
start=$(date +%s.%N)
psql_bench -c "SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys'" >/dev/null ||
    exit 1
seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
read -r tomb_rows tomb_total tomb_heap tomb_indexes < <(measure idempotency.key_tombstones)
left=$(psql_bench -c "SELECT count(*) FROM idempotency.idempotency_keys")

echo "| form | keys | bytes per key (with indexes) | heap bytes per key | indexes, bytes per key | per million keys |"
echo "|---|---:|---:|---:|---|---:|"
echo "| full row (result kept) | $full_rows | $(per "$full_total" "$full_rows") B | $(per "$full_heap" "$full_rows") B |" \
    "$(indexes_per_key "$full_indexes" "$full_rows") | $(per_million "$full_total" "$full_rows") |"
echo "| tombstone | $tomb_rows | $(per "$tomb_total" "$tomb_rows") B | $(per "$tomb_heap" "$tomb_rows") B |" \
    "$(indexes_per_key "$tomb_indexes" "$tomb_rows") | $(per_million "$tomb_total" "$tomb_rows") |"
echo
echo "Keys of 32 characters in scope 'default', each with a 32-byte fingerprint and a 43-byte" \
    "result; the purge moved $tomb_rows keys into tombstones in $seconds s" \
    "($left left in the keys table); sizes after VACUUM ANALYZE. A tombstone is" \
    "$(awk -v t="$tomb_total" -v f="$full_total" 'BEGIN { printf "%.2f", (f > 0 ? t / f : 0) }') of a full row."
