#!/usr/bin/env bash
# Instructions per event that idem-relay itself executes (its own process,
# every thread; not PostgreSQL's) draining a backlog to stdout with --once,
# counted by valgrind (callgrind) instead of timed, so that two builds
# compare within a fraction of a percent on a busy machine. Each backlog is
# drained twice, with N1 and then N2 events; the difference over N2 - N1
# leaves out the start, the connection and the exit. Backlogs: without a
# key, and of distinct keys (nothing behind any event).
# Prints Markdown on stdout: instructions per event for each relay given.
#
# Environment: RELAY_N1 (2000), RELAY_N2 (12000) events, RELAY_PORT
# (54443), RELAY_BINARIES (the installed idem-relay; several paths,
# space-separated, are counted side by side, e.g. an older build first).
# Run alone: it needs valgrind, which it installs.
set -u
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/callgrind.sh"

n1=${RELAY_N1:-2000}
n2=${RELAY_N2:-12000}
port=${RELAY_PORT:-54443}

callgrind_cluster relay-instructions "$port" "idempotency.worker_enabled = off" \
    "idempotency.outbox_notify = off" || exit 1
binaries=${RELAY_BINARIES:-$bindir/idem-relay}
psql_bench() { as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_bench -c "CREATE EXTENSION idempotency" >/dev/null || exit 1
dsn="host=$dir port=$port user=postgres dbname=bench"

# fill N KEYED: a backlog of N events on topic 'orders', of distinct keys
# when KEYED is 1.
fill() {
    local key=NULL
    [ "$2" = 1 ] && key="'key-' || i"
    psql_bench >/dev/null <<SQL
TRUNCATE idempotency.outbox;
SELECT count(idempotency.outbox_enqueue('orders', jsonb_build_object('order', i, 'amount', i * 3), $key))
  FROM generate_series(1, $1) i;
VACUUM ANALYZE idempotency.outbox;
SQL
}
# instructions BINARY N KEYED: the relay's instructions draining N events.
instructions() {
    local out=$dir/relay.callgrind
    fill "$2" "$3" || return 1
    rm -f "$out"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --dsn "$dsn" --relay bench \
        --sink stdout --topics orders --once --batch 100 --progress-interval 0 \
        >/dev/null 2>"$dir/relay.log" || { tail -5 "$dir/relay.log" >&2; return 1; }
    [ "$(psql_bench -Atc "SELECT count(*) FROM idempotency.outbox WHERE state = 'delivered'")" = "$2" ] ||
        { echo "relay_instructions: not every event was delivered" >&2; return 1; }
    sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out"
}
per_event() {  # per_event BINARY KEYED
    local a b
    a=$(instructions "$1" "$n1" "$2") || return 1
    b=$(instructions "$1" "$n2" "$2") || return 1
    echo $(((b - a) / (n2 - n1)))
}

header="| backlog"
rule="|---"
declare -A counts
for binary in $binaries; do
    header+=" | $binary"
    rule+="|---:"
    for keyed in 0 1; do
        log "relay instructions: $binary, $([ $keyed = 1 ] && echo distinct keys || echo no key)"
        counts[$binary.$keyed]=$(per_event "$binary" "$keyed") || exit 1
    done
done
echo "$header |"
echo "$rule|"
for keyed in 0 1; do
    line="| $([ $keyed = 1 ] && echo "distinct keys" || echo "without a key")"
    for binary in $binaries; do line+=" | ${counts[$binary.$keyed]}"; done
    echo "$line |"
done
echo
echo "valgrind callgrind, idem-relay --once --sink stdout --batch 100 into /dev/null," \
    "$n1 and $n2 events counted; PostgreSQL $(as_pg "$bindir/postgres" --version | awk '{ print $3 }')."
