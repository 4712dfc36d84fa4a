#!/usr/bin/env bash
# `make bench`: the extension's claim/complete path against hand-written
# plain SQL and PL/pgSQL (test/bench/baselines.sql), measured side by side in
# one run on one throwaway cluster with durable commits.
#
# Scenarios (each script execution is one pgbench "transaction"):
#   one_txn    BEGIN; claim a new key; complete it; COMMIT
#   two_txn    claim a new key (commits), then complete it (commits)
#   duplicate  claim of one of 10000 preloaded COMPLETED keys -> completed + result
#
# Environment: BENCH_SECONDS (10) per pgbench run, BENCH_CLIENTS ("1 4 16"),
# BENCH_ROUNDS (1): with more, the three variants are run that many times,
# interleaved in rotating order, and the median tps is reported (on a shared
# or noisy machine single runs vary by 20% and more); BENCH_OUT
# (bench-results.md in the current directory) for the Markdown table,
# BENCH_PORT (54430). Benchmarks never fail a build: the exit status is
# non-zero only when something could not run.
set -u
. "$(dirname "$0")/../lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-10}
clients_list=${BENCH_CLIENTS:-"1 4 16"}
rounds=${BENCH_ROUNDS:-1}
port=${BENCH_PORT:-54430}
out=${BENCH_OUT:-bench-results.md}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
preload=10000
scenarios="one_txn two_txn duplicate"
variants="extension plain plpgsql"

ensure_packages || exit 1
build_and_install || exit 1
bindir=$(pg_bindir)

dir=$(mktemp -d /tmp/idempotency-bench.XXXXXX)
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting a throwaway cluster on port $port"
if ! start_cluster "$dir" "$port" \
    "shared_buffers = 256MB" \
    "synchronous_commit = on" \
    "max_wal_size = 4GB" \
    "max_connections = 100"; then
    echo "bench: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

# The scripts must be readable by the OS user that runs pgbench.
mkdir -p "$dir/scripts"
cp "$here"/scripts/*.sql "$here/baselines.sql" "$dir/scripts/"
chown -R "$IDEM_OS_USER" "$dir/scripts"

psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -A -t \
        -v ON_ERROR_STOP=1 "$@"
}

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
psql_bench -c "CREATE EXTENSION idempotency" || exit 1
psql_bench -f "$dir/scripts/baselines.sql" || exit 1

# Every run starts from the same state: both tables truncated, the same
# preloaded COMPLETED keys, fresh statistics, and a checkpoint.
reset_tables() {
    psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys" \
        -c "SELECT bench.preload($preload)" \
        -c "VACUUM ANALYZE idempotency.idempotency_keys" \
        -c "VACUUM ANALYZE bench.idempotency_keys" \
        -c "CHECKPOINT" >/dev/null
}

# run_one SCENARIO VARIANT CLIENTS: prints the tps, or "failed".
run_one() {
    local scenario=$1 variant=$2 clients=$3 jobs logf status tps
    jobs=$((clients < 2 ? clients : 2))
    logf="$dir/$scenario.$variant.c$clients.log"
    if ! reset_tables; then echo failed; return; fi
    as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -T "$seconds" \
        -c "$clients" -j "$jobs" -M prepared -D n=0 \
        -f "$dir/scripts/${scenario}_${variant}.sql" bench >"$logf" 2>&1
    status=$?
    tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$logf")
    if [ "$status" -ne 0 ] || [ -z "$tps" ] || grep -q 'aborted' "$logf"; then
        echo "bench: $scenario/$variant with $clients clients failed:" >&2
        tail -n 20 "$logf" >&2
        echo failed
        return
    fi
    printf '%.0f\n' "$tps"
}

median() {  # median of the arguments; "failed" when any run failed
    case " $* " in *" failed "*) echo failed; return ;; esac
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) print v[(NR + 1) / 2]; else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() {  # ratio A B: A/B with two decimals, or "-"
    case "$1$2" in *failed*) echo "-"; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
}

rows=()
failures=0
for scenario in $scenarios; do
    for clients in $clients_list; do
        declare -A runs=() tps=()
        read -ra order <<<"$variants"
        for ((round = 1; round <= rounds; round++)); do
            for variant in "${order[@]}"; do
                log "$scenario, $clients clients, $variant (${seconds}s, round $round/$rounds)"
                result=$(run_one "$scenario" "$variant" "$clients")
                [ "$result" = failed ] && failures=$((failures + 1))
                runs[$variant]="${runs[$variant]:-} $result"
            done
            order=("${order[@]:1}" "${order[0]}")  # rotate, so no variant always goes first
        done
        for variant in $variants; do
            # shellcheck disable=SC2086
            tps[$variant]=$(median ${runs[$variant]})
            [ "$rounds" -gt 1 ] && log "$scenario, $clients clients, $variant: tps per round${runs[$variant]}"
        done
        rows+=("$scenario|$clients|${tps[extension]}|${tps[plain]}|${tps[plpgsql]}|$(ratio "${tps[extension]}" "${tps[plain]}")|$(ratio "${tps[extension]}" "${tps[plpgsql]}")")
        unset runs tps
    done
done

hot=$(psql_bench -F ' ' -c "SELECT relid::regclass, n_tup_upd, n_tup_hot_upd
    FROM pg_stat_user_tables WHERE relname = 'idempotency_keys' ORDER BY 1")
version=$(psql_bench -c "SHOW server_version")

header="scenario|clients|extension tps|plain SQL tps|PL/pgSQL tps|ext/plain|ext/plpgsql"
echo
echo "idempotency benchmark: PostgreSQL $version, $(nproc) cores, ${seconds}s per run," \
    "$rounds round(s) (median), pgbench -M prepared, synchronous_commit = on, shared_buffers = 256MB"
{
    echo "$header"
    printf '%s\n' "${rows[@]}"
} | awk -F'|' '{ printf "%-10s %7s %14s %14s %13s %10s %12s\n", $1, $2, $3, $4, $5, $6, $7 }'
echo
echo "updates over all runs (HOT share):"
echo "$hot" | awk '{ printf "  %-34s %10d updates, %5.1f%% HOT\n", $1, $2, ($2 ? 100 * $3 / $2 : 0) }'

{
    echo "# idempotency benchmark"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $version, $(nproc) cores;" \
        "pgbench -n -M prepared -T $seconds, -j min(clients, 2); median of $rounds round(s);" \
        "synchronous_commit = on, shared_buffers = 256MB;" \
        "tables truncated, $preload completed keys preloaded and a checkpoint before every run."
    echo
    echo "- one_txn: BEGIN; claim a new key; complete it; COMMIT"
    echo "- two_txn: claim a new key (commit), then complete it (commit)"
    echo "- duplicate: claim of a completed key, answered \`completed\` with the stored result"
    echo
    echo "| ${header//|/ | } |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
} >"$out"
log "results written to $out"

if [ "$failures" -gt 0 ]; then
    echo "bench: $failures run(s) failed" >&2
    exit 1
fi
exit 0
