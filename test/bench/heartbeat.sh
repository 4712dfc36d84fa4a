#!/usr/bin/env bash
# A heartbeat storm: BENCH_HEARTBEAT_CLIENTS (16) clients heartbeat
# BENCH_HEARTBEAT_KEYS (200) PROCESSING keys for BENCH_HEARTBEAT_SECONDS
# (30) s, against the keys layout of 0.5.0 (an index on lease_until) and the
# current one (the live keys' index on active_since), side by side on one
# cluster with the background workers and autovacuum on. Reports the share
# of heartbeats that were HOT updates (pg_stat_user_tables) and the size of
# the keys table and its indexes before and after, against the bytes of the
# live rows. Prints Markdown on stdout.
#
# Environment: BENCH_HEARTBEAT_SECONDS, BENCH_HEARTBEAT_CLIENTS,
# BENCH_HEARTBEAT_KEYS, BENCH_HEARTBEAT_PORT (54433). Run by `make bench`
# (section heartbeat) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

seconds=${BENCH_HEARTBEAT_SECONDS:-30}
clients=${BENCH_HEARTBEAT_CLIENTS:-16}
keys=${BENCH_HEARTBEAT_KEYS:-200}
port=${BENCH_HEARTBEAT_PORT:-54433}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-heartbeat.XXXXXX")
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 128MB" "max_connections = 100" ||
    { cat "$dir/server.log" >&2; exit 1; }

psql_db() {  # psql_db DB ARGS...
    local db=$1; shift
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d "$db" -X -q -A -t -F ' ' \
        -v ON_ERROR_STOP=1 "$@"
}

# What the statistics and the catalog say of the keys table: updates, HOT
# updates, heap bytes (the main fork: no free space or visibility map),
# index bytes, live rows' bytes.
measure() {  # measure DB
    psql_db "$1" -c "SELECT pg_stat_force_next_flush()" -c "
SELECT s.n_tup_upd, s.n_tup_hot_upd,
       pg_relation_size('idempotency.idempotency_keys'), pg_indexes_size('idempotency.idempotency_keys'),
       (SELECT sum(pg_column_size(k.*)) FROM idempotency.idempotency_keys k)
  FROM pg_stat_user_tables s WHERE s.relid = 'idempotency.idempotency_keys'::regclass" | tail -n 1
}

script=$dir/heartbeat.sql
cat >"$script" <<SQL
\\set n random(1, $keys)
SELECT idempotency.idem_heartbeat('hb-' || :n, (SELECT token FROM hb_tokens WHERE n = :n), '1 hour', 'hb');
SQL
chmod 644 "$script"

echo "| layout | heartbeats | HOT updates | heap before → after | indexes before → after | heap + indexes, after ÷ before | after ÷ live rows' bytes |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for version in 0.5.0 current; do
    db=hb_${version//./_}
    as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || exit 1
    if [ "$version" = current ]; then
        psql_db "$db" -c "CREATE EXTENSION idempotency" || exit 1
        version=$(psql_db "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
    else
        psql_db "$db" -c "CREATE EXTENSION idempotency VERSION '$version'" || exit 1
    fi
    psql_db "$db" -c "CREATE TABLE hb_tokens (n int PRIMARY KEY, token bigint NOT NULL)" \
        -c "INSERT INTO hb_tokens SELECT n, (idempotency.idem_claim('hb-' || n, lease => '1 hour', scope => 'hb')).token
              FROM generate_series(1, $keys) n" \
        -c "VACUUM ANALYZE idempotency.idempotency_keys" || exit 1
    read -r upd0 hot0 table0 index0 live0 <<<"$(measure "$db")"
    log "heartbeat: $clients clients heartbeat $keys keys for ${seconds}s ($version)"
    as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c "$clients" -j 2 -T "$seconds" \
        -f "$script" "$db" >"$dir/pgbench.log" 2>&1 || { cat "$dir/pgbench.log" >&2; exit 1; }
    read -r upd1 hot1 table1 index1 live1 <<<"$(measure "$db")"
    awk -v v="$version" -v u=$((upd1 - upd0)) -v h=$((hot1 - hot0)) -v t0="$table0" -v t1="$table1" \
        -v i0="$index0" -v i1="$index1" -v live="$live1" 'BEGIN {
        hot = u > 0 ? 100 * h / u : 0
        printf "| %s | %d | %.1f%% | %d kB → %d kB | %d kB → %d kB | %.2f | %.1f |\n", \
            v, u, hot, t0 / 1024, t1 / 1024, i0 / 1024, i1 / 1024, (t1 + i1) / (t0 + i0), \
            (t1 + i1) / live
    }'
done
