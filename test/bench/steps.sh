#!/usr/bin/env bash
# Multi-step work: a job of three steps (claim; reserve, charge and email,
# each recorded with idem_step; complete: five transactions, as a worker
# makes them) through the extension, against the same job written by hand
# in PL/pgSQL with a table of steps (test/bench/steps_baseline.sql, on the
# hand-written keys of test/bench/baselines.sql), side by side in one run on
# one cluster with durable commits: jobs per second at each client count,
# BENCH_STEPS_ROUNDS rounds with the two variants in alternating order, the
# medians and their ratio. Then what a finished job leaves: BENCH_STEPS_JOBS
# jobs of each, bytes per job (tables and indexes) after a VACUUM and at
# rest (after VACUUM FULL). Prints Markdown on stdout.
#
# Environment: BENCH_SECONDS (10) per run, BENCH_STEPS_CLIENTS ("1 16"),
# BENCH_STEPS_ROUNDS (3), BENCH_STEPS_JOBS (5000), BENCH_STEPS_PORT
# (54442). Run by `make bench` (section steps) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-10}
clients_list=${BENCH_STEPS_CLIENTS:-"1 16"}
rounds=${BENCH_STEPS_ROUNDS:-3}
jobs=${BENCH_STEPS_JOBS:-5000}
port=${BENCH_STEPS_PORT:-54442}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-steps.XXXXXX")
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 256MB" "synchronous_commit = on" \
    "max_wal_size = 4GB" || { cat "$dir/server.log" >&2; exit 1; }
mkdir -p "$dir/scripts"
cp "$here/baselines.sql" "$here/steps_baseline.sql" "$here"/scripts/steps_*.sql "$dir/scripts/"
chown -R "$IDEM_OS_USER" "$dir/scripts"
psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}
psql_bench -c "CREATE EXTENSION idempotency" -f "$dir/scripts/baselines.sql" \
    -f "$dir/scripts/steps_baseline.sql" >/dev/null || exit 1

# Every run starts from empty tables, fresh statistics and a checkpoint.
reset_tables() {
    psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys, bench.key_steps" \
        -c "VACUUM ANALYZE idempotency.idempotency_keys" -c "VACUUM ANALYZE bench.idempotency_keys" \
        -c "VACUUM ANALYZE bench.key_steps" -c "CHECKPOINT" >/dev/null
}

# run VARIANT CLIENTS [pgbench options]: prints the jobs per second, or "failed".
run() {
    local variant=$1 clients=$2 logf tps
    shift 2
    logf=$dir/steps.$variant.c$clients.log
    reset_tables || { echo failed; return; }
    as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c "$clients" \
        -j $((clients < 2 ? clients : 2)) -M prepared -D n=0 "$@" \
        -f "$dir/scripts/steps_$variant.sql" postgres >"$logf" 2>&1
    tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$logf")
    if [ -z "$tps" ] || grep -q 'aborted' "$logf"; then
        echo "steps: $variant with $clients clients failed:" >&2
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

echo "| clients | extension, jobs/s | PL/pgSQL with a steps table, jobs/s | extension / PL/pgSQL | runs (extension; PL/pgSQL) |"
echo "|---:|---:|---:|---:|---|"
for clients in $clients_list; do
    ext=()
    plp=()
    for ((r = 1; r <= rounds; r++)); do
        log "steps: $clients clients, round $r of $rounds"
        if ((r % 2)); then
            ext+=("$(run extension "$clients" -T "$seconds")")
            plp+=("$(run plpgsql "$clients" -T "$seconds")")
        else
            plp+=("$(run plpgsql "$clients" -T "$seconds")")
            ext+=("$(run extension "$clients" -T "$seconds")")
        fi
    done
    e=$(median "${ext[@]}")
    p=$(median "${plp[@]}")
    echo "| $clients | $e | $p | $(ratio "$e" "$p") | ${ext[*]}; ${plp[*]} |"
done
echo

# bytes MODE RELATIONS...: their tables and indexes after VACUUM (MODE
# plain: the space the run took, dead versions' room kept for reuse) or
# VACUUM FULL (MODE full: the finished jobs at rest).
bytes() {
    local mode=$1 rel sum=0 size
    shift
    for rel in "$@"; do
        psql_bench -c "VACUUM $([ "$mode" = full ] && echo FULL) $rel" >/dev/null || return 1
        size=$(psql_bench -c "SELECT pg_total_relation_size('$rel')") || return 1
        sum=$((sum + size))
    done
    echo "$sum"
}
log "steps: $jobs finished jobs of each"
per_job() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (b > 0 ? a / b : 0) }'; }
run extension 1 -t "$jobs" >/dev/null
ext_jobs=$(psql_bench -c "SELECT count(*) FROM idempotency.idempotency_keys WHERE status = 'COMPLETED'")
ext_run=$(bytes plain idempotency.idempotency_keys)
ext_rest=$(bytes full idempotency.idempotency_keys)
run plpgsql 1 -t "$jobs" >/dev/null
plp_jobs=$(psql_bench -c "SELECT count(*) FROM bench.idempotency_keys WHERE status = 'COMPLETED'")
plp_run=$(bytes plain bench.idempotency_keys bench.key_steps)
plp_rest=$(bytes full bench.idempotency_keys bench.key_steps)
echo "| variant | finished jobs | bytes per job after the run (VACUUM) | bytes per job at rest (VACUUM FULL) |"
echo "|---|---:|---:|---:|"
echo "| extension (steps in the key's row) | $ext_jobs | $(per_job "$ext_run" "$ext_jobs") | $(per_job "$ext_rest" "$ext_jobs") |"
echo "| PL/pgSQL (a row per step in bench.key_steps) | $plp_jobs | $(per_job "$plp_run" "$plp_jobs") | $(per_job "$plp_rest" "$plp_jobs") |"
echo
echo "Each job: a claim of a new key, three steps with small results (15 to 25 bytes of JSON)" \
    "and a complete, five transactions with durable commits; ${seconds} s per run, the median of" \
    "$rounds runs per variant in alternating order."
