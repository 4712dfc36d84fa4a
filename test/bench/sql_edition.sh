#!/usr/bin/env bash
# The SQL edition (src/sql_edition/) beside the C++ extension and the
# hand-written PL/pgSQL baseline (test/bench/baselines.sql), side by side
# in one run on one cluster with durable commits and the library
# preloaded: database `cpp` has the C++ extension and the baseline's
# bench schema, database `sqled` the SQL edition (CREATE EXTENSION
# idempotency_sql). The scenarios of the claim section (one_txn, two_txn,
# duplicate: test/bench/scripts/*_extension.sql, run unchanged against
# both editions, and *_plpgsql.sql), at each client count,
# BENCH_SQLED_ROUNDS rounds with the three variants in rotating order;
# the medians and their ratios. Prints Markdown on stdout.
#
# Environment: BENCH_SECONDS (10) per run, BENCH_SQLED_CLIENTS ("1 16"),
# BENCH_SQLED_ROUNDS (3), BENCH_SQLED_PORT (54443). Run by `make bench`
# (section sql_edition) or alone (IDEM_BENCH_BUILT=1 after make install).
set -u
. "$(dirname "$0")/../lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-10}
clients_list=${BENCH_SQLED_CLIENTS:-"1 16"}
rounds=${BENCH_SQLED_ROUNDS:-3}
port=${BENCH_SQLED_PORT:-54443}
preload=10000

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-sqled-bench.XXXXXX")
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 256MB" "synchronous_commit = on" \
    "max_wal_size = 4GB" || { cat "$dir/server.log" >&2; exit 1; }
mkdir -p "$dir/scripts"
cp "$here/baselines.sql" "$here"/scripts/{one_txn,two_txn,duplicate}_{extension,plpgsql}.sql "$dir/scripts/"
chown -R "$IDEM_OS_USER" "$dir/scripts"
psql_bench() {  # psql_bench DATABASE ARGS...
    local db=$1
    shift
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d "$db" -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}
psql_bench postgres -c "CREATE DATABASE cpp" -c "CREATE DATABASE sqled" >/dev/null || exit 1
# The baseline's schema in both: its preload fills the keys table of the
# database's edition too.
psql_bench cpp -c "CREATE EXTENSION idempotency" -f "$dir/scripts/baselines.sql" >/dev/null || exit 1
psql_bench sqled -c "CREATE EXTENSION idempotency_sql" -f "$dir/scripts/baselines.sql" >/dev/null || exit 1

# Every run starts from the same state: the tables emptied, the same
# preloaded COMPLETED keys, fresh statistics, and a checkpoint.
reset_tables() {
    local db
    for db in cpp sqled; do
        psql_bench "$db" -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys, bench.floor_keys" \
            -c "SELECT bench.preload($preload)" -c "VACUUM ANALYZE idempotency.idempotency_keys" \
            -c "VACUUM ANALYZE bench.idempotency_keys" >/dev/null || return 1
    done
    psql_bench postgres -c "CHECKPOINT" >/dev/null
}

# run SCENARIO VARIANT CLIENTS: prints the transactions per second, or "failed".
run() {
    local scenario=$1 variant=$2 clients=$3 db script logf tps
    case $variant in
        cpp) db=cpp; script=${scenario}_extension ;;
        sql) db=sqled; script=${scenario}_extension ;;
        plpgsql) db=cpp; script=${scenario}_plpgsql ;;
    esac
    logf=$dir/$scenario.$variant.c$clients.log
    reset_tables || { echo failed; return; }
    as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c "$clients" \
        -j $((clients < 2 ? clients : 2)) -M prepared -D n=0 -T "$seconds" \
        -f "$dir/scripts/$script.sql" "$db" >"$logf" 2>&1
    tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$logf")
    if [ -z "$tps" ] || grep -q 'aborted' "$logf"; then
        echo "sql_edition: $scenario $variant with $clients clients failed:" >&2
        tail -n 20 "$logf" >&2
        echo failed
        return
    fi
    printf '%.0f\n' "$tps"
}
median() {
    case " $* " in *" failed "*) echo failed; return ;; esac
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) print v[(NR + 1) / 2]; else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() {
    case "$1$2" in *failed*) echo "-"; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
}

echo "| scenario | clients | C++ extension, tps | SQL edition, tps | PL/pgSQL, tps | SQL edition / C++ | SQL edition / PL/pgSQL | C++ / PL/pgSQL |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
variants=(cpp sql plpgsql)
for scenario in one_txn two_txn duplicate; do
    for clients in $clients_list; do
        declare -A got=([cpp]="" [sql]="" [plpgsql]="")
        for ((r = 0; r < rounds; r++)); do
            log "sql_edition: $scenario, $clients clients, round $((r + 1)) of $rounds"
            for ((v = 0; v < 3; v++)); do
                variant=${variants[$(((v + r) % 3))]}
                got[$variant]+=" $(run "$scenario" "$variant" "$clients")"
            done
        done
        c=$(median ${got[cpp]})
        s=$(median ${got[sql]})
        p=$(median ${got[plpgsql]})
        echo "| $scenario | $clients | $c | $s | $p | $(ratio "$s" "$c") | $(ratio "$s" "$p") | $(ratio "$c" "$p") |"
        unset got
    done
done
echo
echo "one_txn: a claim of a new key and its complete in one transaction; two_txn: the same in two;" \
    "duplicate: a claim of one of $preload finished keys. The same pgbench scripts against both" \
    "editions; ${seconds} s per run, the median of $rounds runs per variant in rotating order."
