#!/usr/bin/env bash
# Instructions per event of an outbox drain, counted by valgrind (callgrind)
# instead of timed, so that two builds compare within a fraction of a
# percent on a busy machine (see test/bench/instructions.sh). One backlog of
# 15,000 events of each kind, prefilled once: without a key, of distinct
# keys (nothing behind any event), and of one hot key. Each drain runs
# `outbox_ack(array(SELECT id FROM outbox_claim('r', 100, ...)))`, one
# transaction a line, in single-user mode on a fresh copy of the prefilled
# cluster, N1 and then N2 times; the difference over the events handed out
# leaves out the start and the shutdown. The hot key is drained with
# idempotency.outbox_run_length 1 (one event a claim) and 100 (runs; "-"
# on a version without them).
# Prints Markdown on stdout: instructions per event, and each drain's
# ratio to the drain without a key.
#
# Environment: DRAIN_N1 (5), DRAIN_N2 (25) claims, DRAIN_PORT (54441).
# Run alone: it needs valgrind, which it installs.
set -u
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/callgrind.sh"

n1=${DRAIN_N1:-5}
n2=${DRAIN_N2:-25}
port=${DRAIN_PORT:-54441}

callgrind_cluster drain "$port" "idempotency.worker_enabled = off" "idempotency.outbox_notify = off" ||
    exit 1
as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -v ON_ERROR_STOP=1 <<'SQL' >/dev/null || exit 1
CREATE EXTENSION idempotency;
SELECT count(idempotency.outbox_enqueue('u', jsonb_build_object('order', i))) FROM generate_series(1, 15000) i;
SELECT count(idempotency.outbox_enqueue('k', jsonb_build_object('order', i), 'key-' || i)) FROM generate_series(1, 15000) i;
SELECT count(idempotency.outbox_enqueue('h', jsonb_build_object('order', i), 'hot')) FROM generate_series(1, 15000) i;
VACUUM ANALYZE;
SQL
as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || exit 1

# drain TOPIC RUN N: N claims of 100 and their acks; the run length first.
drain() {
    if [ "$2" -gt 1 ]; then echo "SET idempotency.outbox_run_length = $2"; else echo "SELECT 1"; fi
    for ((i = 0; i < $3; i++)); do
        echo "SELECT idempotency.outbox_ack(array(SELECT id FROM idempotency.outbox_claim('r', 100, '30 seconds', '{$1}')))"
    done
}
# per_event TOPIC RUN EVENTS_PER_CLAIM: instructions per event handed out.
per_event() {
    local n a b
    for n in "$n1" "$n2"; do
        rm -rf "$dir/copy" && cp -a "$dir/data" "$dir/copy" || return 1
        drain "$1" "$2" "$n" >"$dir/input.sql"
        b=$(single_user_instructions "$dir/copy" "$dir/input.sql" "$dir/single.log") || return 1
        [ "$n" = "$n1" ] && a=$b
    done
    echo $(((b - a) / ((n2 - n1) * $3)))
}

log "drain: without a key"
unkeyed=$(per_event u 1 100) || exit 1
log "drain: distinct keys"
distinct=$(per_event k 1 100) || exit 1
log "drain: one hot key, one event a claim"
hot_one=$(per_event h 1 1) || exit 1
log "drain: one hot key, runs of 100"
# A version without runs (before 0.7.0) refuses the setting.
hot_runs=$(per_event h 100 100) || hot_runs=-

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-") print "-"; else printf "%.2f", a / b }'; }
echo "| drain (claims of 100, acked in the same transaction) | instructions per event | ÷ without a key |"
echo "|---|---:|---:|"
echo "| without a key | $unkeyed | 1.00 |"
echo "| distinct keys | $distinct | $(ratio "$distinct" "$unkeyed") |"
echo "| one hot key, \`outbox_run_length\` 1 (one event a claim) | $hot_one | $(ratio "$hot_one" "$unkeyed") |"
echo "| one hot key, \`outbox_run_length\` 100 | $hot_runs | $(ratio "$hot_runs" "$unkeyed") |"
echo
echo "valgrind callgrind, single-user mode, claims $n1 to $n2 counted; PostgreSQL" \
    "$(as_pg "$bindir/postgres" --version | awk '{ print $3 }')."
