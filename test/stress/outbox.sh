#!/usr/bin/env bash
# Stress test of the transactional outbox: at-least-once delivery, per-key
# order and transactional enqueue under racing producers and relays.
#
# Producers (pgbench, STRESS_PRODUCERS clients) enqueue 1-3 events per
# transaction over 2 topics x 32 keys plus NULL-key events (keys in (topic,
# key) order; one transaction in ten adds a keyless event with a dedup_key
# from a small pool), hold the transaction open 0-30 ms, and roll back one
# in five: what committed is recorded in `produced` in the same
# transaction, what rolled back in `rolled_back` after the rollback (payload
# numbers come from a sequence, so they are never reused). Relays (pgbench,
# STRESS_RELAYS clients) claim batches of 1-16 events with leases of
# 300-700 ms. One claim in five delivers them to the `receiver` table and
# acks, or nacks, inside the claim's own transaction, or does so and then
# rolls back. The others commit the claim, then deliver in a transaction of
# their own before acking (at-least-once); some die before delivering or
# before acking (the lease runs out and the event is re-claimed), some nack
# retryably, some stall past their lease and ack late. idem_maintenance()
# runs alongside, as the background worker would. About a third of the
# claims end in another attempt, so idempotency.outbox_max_attempts is raised
# to keep dead-lettering (not under test here) out of the run; commit
# timestamps are on for the per-key hand-off check. After STRESS_SECONDS the
# load stops and one relay drains the outbox (maintenance + claim, deliver,
# ack) until nothing is pending or in flight, within STRESS_DRAIN_SECONDS.
#
# Then it checks (outbox_check.sql): every committed event was delivered at
# least once and is `delivered`; no rolled-back enqueue was ever delivered or
# visible; per (topic, key) first deliveries came in the order the enqueues
# committed (the place the outbox gave each event), and each
# event was first handed out only after the previous one was delivered;
# redeliveries only after a lease expiry; no event handed out twice within
# a live lease; outbox_ack's results add up to the delivered events; nothing
# left pending, in flight or dead; no 23505 and no unexpected error anywhere.
# Prints a summary table and exits 0 only when every check holds.
#
# Run as root after the extension is installed; it builds and installs
# nothing. Settings: STRESS_PORT, STRESS_SECONDS, STRESS_PRODUCERS,
# STRESS_RELAYS, STRESS_DRAIN_SECONDS, STRESS_KEEP (non-empty: keep the
# cluster running and its folder, for a post-mortem).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${STRESS_PORT:-54411}
seconds=${STRESS_SECONDS:-20}
producers=${STRESS_PRODUCERS:-4}
relays=${STRESS_RELAYS:-6}
drain_seconds=${STRESS_DRAIN_SECONDS:-60}
db=outbox_stress
started=$SECONDS

dir=$(mktemp -d /tmp/idempotency-outbox-stress.XXXXXX) || exit 1
maintenance_pid=
keep=${STRESS_KEEP:-}  # set: leave the cluster running and its folder in place
cleanup() {
    touch "$dir/stop" 2>/dev/null
    [ -n "$maintenance_pid" ] && wait "$maintenance_pid" 2>/dev/null
    if [ -n "$keep" ]; then
        echo "outbox stress: kept $dir (port $port); stop it with pg_ctl -D $dir/data stop" >&2
        return
    fi
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bindir=$(pg_bindir)
psql_db() {
    as_pg "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 "$@"
}

log "outbox stress: cluster in $dir, port $port"
if ! start_cluster "$dir" "$port" \
    "max_connections = 50" \
    "track_commit_timestamp = on" \
    "idempotency.outbox_max_attempts = 1000" \
    "log_line_prefix = '%m [%p] %e '" \
    "log_min_messages = warning" \
    "log_min_error_statement = error"; then
    echo "outbox stress: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

# Scripts go into the cluster's folder, which the postgres OS user owns.
for f in outbox_setup.sql outbox_producer.pgbench outbox_relay.pgbench outbox_check.sql; do
    cp "$here/$f" "$dir/" && chown "$IDEM_OS_USER" "$dir/$f" || exit 1
done

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || exit 1
psql_db -f "$dir/outbox_setup.sql" || { echo "outbox stress: setup failed" >&2; exit 1; }

# The worker's part, in case the library's worker is off: a sweep every 250 ms.
(
    while [ ! -e "$dir/stop" ]; do
        psql_db -c "SELECT * FROM idempotency.idem_maintenance()" >/dev/null 2>>"$dir/maintenance.err"
        sleep 0.25
    done
) &
maintenance_pid=$!

log "outbox stress: $producers producers, $relays relays, ${seconds}s"
load_start=$SECONDS
as_pg "$bindir/pgbench" -n -h "$dir" -p "$port" -U postgres -c "$producers" -j 1 \
    -T "$seconds" -f "$dir/outbox_producer.pgbench" "$db" >"$dir/producers.out" 2>&1 &
producers_pid=$!
as_pg "$bindir/pgbench" -n -h "$dir" -p "$port" -U postgres -c "$relays" -j 1 \
    -T "$seconds" -f "$dir/outbox_relay.pgbench" "$db" >"$dir/relays.out" 2>&1 &
relays_pid=$!
wait "$producers_pid"
producers_status=$?
wait "$relays_pid"
relays_status=$?
load_seconds=$((SECONDS - load_start))

log "outbox stress: draining (at most ${drain_seconds}s)"
drain_start=$SECONDS
drain_rounds=0
left=-1
while :; do
    psql_db -c "SELECT * FROM idempotency.idem_maintenance()" >/dev/null 2>>"$dir/drain.err"
    got=$(psql_db -At -c "CALL relay_round(1000, 500, 30000, 100)" 2>>"$dir/drain.err")
    drain_rounds=$((drain_rounds + 1))
    left=$(psql_db -At -c "SELECT count(*) FROM idempotency.outbox WHERE state IN ('pending', 'in_flight')" \
        2>>"$dir/drain.err")
    [ "$left" = 0 ] && break
    [ $((SECONDS - drain_start)) -ge "$drain_seconds" ] && break
    [ "${got:-0}" = 0 ] && sleep 0.1
done
drain_seconds_used=$((SECONDS - drain_start))
touch "$dir/stop"
wait "$maintenance_pid" 2>/dev/null
maintenance_pid=

if ! psql_db -At -F '|' -f "$dir/outbox_check.sql" >"$dir/check.out" 2>&1; then
    echo "outbox stress: checks could not run:" >&2
    cat "$dir/check.out" >&2
    echo "'checks ran'|no|FAIL" >"$dir/check.out"
fi

pgbench_figure() {  # pgbench_figure FILE REGEX
    sed -nE "s/$2/\1/p" "$1" | head -n 1
}
p_tx=$(pgbench_figure "$dir/producers.out" '^number of transactions actually processed: ([0-9]+).*')
r_tx=$(pgbench_figure "$dir/relays.out" '^number of transactions actually processed: ([0-9]+).*')
p_failed=$(pgbench_figure "$dir/producers.out" '^number of failed transactions: ([0-9]+).*')
r_failed=$(pgbench_figure "$dir/relays.out" '^number of failed transactions: ([0-9]+).*')
aborted=$(cat "$dir/producers.out" "$dir/relays.out" | grep -cE 'client [0-9]+ .*abort')
unique_client=$(cat "$dir/producers.out" "$dir/relays.out" "$dir"/*.err 2>/dev/null |
    grep -cE '23505|duplicate key value')
unique_server=$(grep -cE ' 23505 |duplicate key value' "$dir/server.log")
server_errors=$(grep -cE ' (ERROR|FATAL|PANIC): ' "$dir/server.log")
client_errors=$(cat "$dir"/*.err 2>/dev/null | grep -c .)

rows=()
verdict() {  # verdict NAME VALUE CONDITION(ok when true)
    if [ "$3" = true ]; then rows+=("$1|$2|ok"); else rows+=("$1|$2|FAIL"); fi
}
is() { if eval "$1"; then echo true; else echo false; fi; }
verdict "producers pgbench exit status" "$producers_status" "$(is '[ "$producers_status" -eq 0 ]')"
verdict "relays pgbench exit status" "$relays_status" "$(is '[ "$relays_status" -eq 0 ]')"
verdict "producer transactions" "${p_tx:-?}" "$(is '[ "${p_tx:-0}" -gt 0 ]')"
verdict "relay rounds" "${r_tx:-?}" "$(is '[ "${r_tx:-0}" -gt 0 ]')"
verdict "pgbench failed transactions" "$((${p_failed:-1} + ${r_failed:-1}))" \
    "$(is '[ $((${p_failed:-1} + ${r_failed:-1})) -eq 0 ]')"
verdict "pgbench aborted clients" "$aborted" "$(is '[ "$aborted" -eq 0 ]')"
verdict "drain finished (events left pending or in flight)" "${left:-?}" "$(is '[ "${left:-1}" = 0 ]')"
verdict "23505 seen by clients or in the server log" "$((unique_client + unique_server))" \
    "$(is '[ $((unique_client + unique_server)) -eq 0 ]')"
verdict "unexpected server errors (ERROR/FATAL/PANIC)" "$server_errors" "$(is '[ "$server_errors" -eq 0 ]')"
verdict "errors of the maintenance and drain loops" "$client_errors" "$(is '[ "$client_errors" -eq 0 ]')"
while IFS= read -r line; do rows+=("$line"); done <"$dir/check.out"
rows+=("load seconds|$load_seconds|info" "drain seconds|$drain_seconds_used|info"
    "drain rounds|$drain_rounds|info" "total seconds|$((SECONDS - started))|info")

failures=0
echo
echo "idempotency outbox stress test: $producers producers, $relays relays, ${seconds}s, leases 300-700 ms"
printf '%-62s %-12s %s\n' "check / figure" "value" "verdict"
printf '%-62s %-12s %s\n' "--------------" "-----" "-------"
for row in "${rows[@]}"; do
    IFS='|' read -r name value mark <<<"$row"
    printf '%-62s %-12s %s\n' "$name" "$value" "$mark"
    [ "$mark" = FAIL ] && failures=$((failures + 1))
done
echo

if [ "$failures" -ne 0 ]; then
    echo "outbox stress: FAILED ($failures checks)"
    for f in producers.out relays.out; do
        echo "--- $f"
        tail -n 30 "$dir/$f"
    done
    echo "--- maintenance and drain errors"
    cat "$dir"/*.err 2>/dev/null | head -n 20
    echo "--- server log (errors)"
    grep -E ' (ERROR|FATAL|PANIC): ' -A 3 "$dir/server.log" | head -n 60
    exit 1
fi
echo "outbox stress: passed"
exit 0
