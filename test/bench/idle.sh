#!/usr/bin/env bash
# What an idle cluster costs: the CPU of the postmaster and all its children
# (read from /proc, exited children included through the postmaster's
# cutime/cstime) over BENCH_IDLE_SECONDS (60) with 1, 10 and 100 databases
# that have the extension and where nothing happens, with the library
# preloaded and without it (the same cluster restarted with
# shared_preload_libraries = ''), and the idempotency workers started per
# minute (counted from the postmaster's "starting background worker" lines,
# log_min_messages = debug1), and the idempotency launcher's own CPU. Both
# measurements start BENCH_IDLE_SETTLE after a restart. Prints a Markdown
# table on stdout.
#
# Environment: BENCH_IDLE_SECONDS (60), BENCH_IDLE_DATABASES ("1 10 100"),
# BENCH_IDLE_SETTLE (25) seconds between a restart and its measurement (the
# launcher's first sweep of every database falls in it), BENCH_IDLE_PORT
# (54431). Run by `make bench` (section idle) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

seconds=${BENCH_IDLE_SECONDS:-60}
databases_list=${BENCH_IDLE_DATABASES:-"1 10 100"}
settle=${BENCH_IDLE_SETTLE:-25}
port=${BENCH_IDLE_PORT:-54431}

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)
hz=$(getconf CLK_TCK)

dir=$(mktemp -d /tmp/idempotency-idle.XXXXXX)
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Autovacuum stays on: it is part of what an idle cluster costs.
start_cluster "$dir" "$port" "log_min_messages = debug1" "max_connections = 120" \
    "max_worker_processes = 16" || { cat "$dir/server.log" >&2; exit 1; }

psql_idle() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}

# CPU ticks of the postmaster and its children so far (children that
# exited are in the postmaster's cutime and cstime once reaped).
cluster_ticks() {
    local pm
    pm=$(head -n 1 "$dir/data/postmaster.pid")
    { echo "$pm"; pgrep -P "$pm"; } | while read -r pid; do
        sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null
    done | awk '{ t += $12 + $13 + $14 + $15 } END { print t + 0 }'
}

restart_with() {  # restart_with PRELOAD: 'idempotency' or ''
    as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || return 1
    sed -i '/^shared_preload_libraries/d' "$dir/data/postgresql.conf"
    echo "shared_preload_libraries = '$1'" >>"$dir/data/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}

# CPU ticks of the idempotency launcher so far (0 without it).
launcher_ticks() {
    local pid
    pid=$(pgrep -f 'idempotency launcher' -P "$(head -n 1 "$dir/data/postmaster.pid")")
    [ -n "$pid" ] || { echo 0; return; }
    sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }'
}

# measure: prints "cluster-%-of-one-core|launcher-%|worker-starts-per-minute"
# over $seconds.
measure() {
    local offset before after launcher_before launcher_after starts
    offset=$(stat -c %s "$dir/server.log")
    before=$(cluster_ticks)
    launcher_before=$(launcher_ticks)
    sleep "$seconds"
    after=$(cluster_ticks)
    launcher_after=$(launcher_ticks)
    starts=$(tail -c +"$((offset + 1))" "$dir/server.log" |
        grep -c 'starting background worker process "idempotency worker')
    awk -v t=$((after - before)) -v l=$((launcher_after - launcher_before)) -v hz="$hz" \
        -v s="$seconds" -v n="$starts" \
        'BEGIN { printf "%.2f|%.2f|%.1f\n", 100 * t / hz / s, 100 * l / hz / s, n * 60 / s }'
}

psql_idle -d postgres -c "CREATE DATABASE idle_template" || exit 1
psql_idle -d idle_template -c "CREATE EXTENSION idempotency" || exit 1
psql_idle -d postgres -c "ALTER DATABASE idle_template WITH IS_TEMPLATE true" || exit 1

created=0
rows=()
for n in $databases_list; do
    while [ "$created" -lt "$n" ]; do
        created=$((created + 1))
        psql_idle -d postgres -c "CREATE DATABASE idle_$created TEMPLATE idle_template STRATEGY FILE_COPY" ||
            exit 1
    done
    log "idle: $n database(s) with the extension, ${seconds}s without the library, then with it"
    restart_with '' || exit 1
    sleep "$settle"
    IFS='|' read -r without _ _ <<<"$(measure)"
    restart_with 'idempotency' || exit 1
    sleep "$settle"
    IFS='|' read -r with launcher starts <<<"$(measure)"
    added=$(awk -v a="$with" -v b="$without" 'BEGIN { printf "%.2f", a - b }')
    rows+=("$n|$without|$with|$added|$launcher|$starts")
    log "idle: $n database(s): without ${without}%, with ${with}% (launcher ${launcher}%), $starts worker starts/min"
done

echo "| databases | without the library, % of one core | with it | difference | of which the idempotency launcher | worker starts per minute |"
echo "|---:|---:|---:|---:|---:|---:|"
for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
echo
echo "$(nproc) cores; ${seconds}s per measurement, ${settle}s after each restart; PostgreSQL $(psql_idle -d postgres -c 'SHOW server_version')."
