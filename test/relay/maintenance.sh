#!/usr/bin/env bash
# idem-relay --maintenance-interval against the SQL edition, where nothing
# but a call of idempotency.idem_maintenance() expires a lease nobody claims
# again or settles a finished key (docs/managed-postgres.md): a throwaway
# cluster without the library preloaded, CREATE EXTENSION idempotency_sql,
# the stdout sink.
#
#   connect    the relay delivers from the SQL edition
#   without    without the option nothing calls idem_maintenance: a relay
#              that delivered (--once, and one left running) leaves an
#              expired lease PROCESSING and logs no pass
#   once       --once with the option makes one pass: the lease expired
#   running    every interval: a lease that runs out while the relay runs is
#              expired, a finished key settled; SIGTERM exits 0
#   refused    a role without EXECUTE: each pass logged as a warning, the
#              next still made, events still delivered, exit 0
#
# Run as root after the extension and idem-relay are installed (make
# install). Prints "ok N - ..." or "not ok N - ..." per check and ends with
# "N passed, N failed"; exits non-zero on any failure. Settings:
# RELAY_MAINTENANCE_PORT (54443), IDEM_RELAY (the binary; default
# $(pg_config --bindir)/idem-relay).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"
. "$here/harness.sh"

port=${RELAY_MAINTENANCE_PORT:-54443}
bindir=$(pg_bindir)
relay_bin=${IDEM_RELAY:-$bindir/idem-relay}
db=relay_maintenance
passed=0
failed=0
number=0
pids=()

dir=$(mktemp -d /tmp/idempotency-relay-maintenance.XXXXXX) || exit 1
chmod 755 "$dir"
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    stop_cluster "$dir"
    if [ "$failed" -eq 0 ] && [ -z "${RELAY_TEST_KEEP:-}" ]; then rm -rf "$dir"; else echo "outputs kept in $dir" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$relay_bin" ] || { echo "idem-relay not found at $relay_bin: run make install first" >&2; echo "0 passed, 1 failed"; exit 1; }
log "relay maintenance: cluster in $dir, port $port"
if ! start_cluster "$dir" "$port" "log_min_messages = warning" "shared_preload_libraries = ''"; then
    cat "$dir/server.log" >&2 2>/dev/null
    echo "0 passed, 1 failed"
    exit 1
fi
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || { echo "0 passed, 1 failed"; exit 1; }
# relay_sweeper may call idem_maintenance, relay_app may not.
sql <<'SQL' >/dev/null || { echo "relay maintenance: setup failed" >&2; echo "0 passed, 1 failed"; exit 1; }
CREATE EXTENSION idempotency_sql;
CREATE ROLE relay_app LOGIN;
CREATE ROLE relay_sweeper LOGIN;
SELECT idempotency.grant_relay(r) FROM unnest(ARRAY['relay_app', 'relay_sweeper']::regrole[]) r;
GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance() TO relay_sweeper;
SQL
dsn() { echo "host=$dir port=$port dbname=$db user=$1"; }
status_of() { sql -c "SELECT status::text FROM idempotency.idempotency_keys WHERE key = '$1'"; }
# claim_expired KEY: a key claimed with a 50 ms lease, returned once the lease has run out.
claim_expired() {
    sql -c "SELECT idempotency.idem_claim('$1', lease => interval '50 milliseconds')" >/dev/null &&
        wait_until 10 sql_is "SELECT lease_until < clock_timestamp() FROM idempotency.idempotency_keys WHERE key = '$1'" t
}
enqueue() { sql -c "SELECT idempotency.outbox_enqueue('$1', '{\"n\": 1}')" >/dev/null; }
delivered() { sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = '$1' AND state = 'delivered'" "$2"; }

# ---------------------------------------------------------------- connect, without
log "without --maintenance-interval"
claim_expired k_without || not_ok "setup: a lease that ran out"
enqueue t_without
once without 30 --dsn "$(dsn relay_sweeper)" --sink stdout --topics t_without
status=$?
check "connect: --once delivers from the SQL edition (exit $status)" test "$status" -eq 0 -a "$(grep -c '"topic":"t_without"' "$dir/without.out")" -eq 1
check "without: --once left the expired lease PROCESSING ($(status_of k_without))" test "$(status_of k_without)" = PROCESSING
check "without: no pass logged" bash -c "! grep -q idem_maintenance '$dir/without.err'"

start_relay without_running --dsn "$(dsn relay_sweeper)" --sink stdout --topics t_without --poll-interval 100ms
without_pid=$relay_pid
enqueue t_without
expect_delivered "without: a running relay delivers" 20 t_without 2 without_running
# Its rounds went on meanwhile; one more event, one more round, to be sure.
enqueue t_without
expect_delivered "without: and again" 20 t_without 3 without_running
check "without: the running relay left the expired lease PROCESSING ($(status_of k_without))" test "$(status_of k_without)" = PROCESSING
stop_relay "$without_pid" 20
status=$?
check "without: SIGTERM exits 0 (status $status)" test "$status" -eq 0

# ---------------------------------------------------------------- once
log "--once --maintenance-interval"
once with_once 30 --dsn "$(dsn relay_sweeper)" --sink stdout --topics t_once --maintenance-interval 1h
status=$?
check "once: exit 0 (status $status)" test "$status" -eq 0
check "once: its one pass expired the lease ($(status_of k_without))" test "$(status_of k_without)" = FAILED_RETRYABLE
if grep -q "idem_maintenance: expire_leases 1" "$dir/with_once.err"; then ok "once: the pass is logged with what it changed"
else not_ok "once: the pass is logged with what it changed"; show_err with_once; fi

# ---------------------------------------------------------------- running
log "a running relay with --maintenance-interval 200ms"
start_relay running --dsn "$(dsn relay_sweeper)" --sink stdout --topics t_running --poll-interval 100ms \
    --maintenance-interval 200ms
running_pid=$relay_pid
sql -c "SELECT idempotency.idem_claim('k_running', lease => interval '300 milliseconds')" >/dev/null
token=$(sql -c "SELECT token FROM idempotency.idem_claim('k_done')")
sql -c "SELECT idempotency.idem_complete('k_done', $token, '{}')" >/dev/null
enqueue t_running
expect_delivered "running: delivers" 20 t_running 1 running
if wait_until 20 sql_is "SELECT status FROM idempotency.idempotency_keys WHERE key = 'k_running'" FAILED_RETRYABLE; then
    ok "running: a lease that ran out while it ran is expired"
else
    not_ok "running: a lease that ran out while it ran is expired" "$(status_of k_running)"; show_err running
fi
if wait_until 20 sql_is "SELECT active_since IS NULL AND purge_at IS NOT NULL FROM idempotency.idempotency_keys WHERE key = 'k_done'" t; then
    ok "running: a finished key is settled"
else
    not_ok "running: a finished key is settled"; show_err running
fi
stop_relay "$running_pid" 20
status=$?
check "running: SIGTERM exits 0 (status $status)" test "$status" -eq 0

# ---------------------------------------------------------------- refused
log "a role without EXECUTE on idem_maintenance"
start_relay refused --dsn "$(dsn relay_app)" --sink stdout --topics t_refused --poll-interval 100ms \
    --maintenance-interval 100ms
refused_pid=$relay_pid
enqueue t_refused
expect_delivered "refused: delivers all the same" 20 t_refused 1 refused
refusals() { [ "$(grep -c 'WARNING: idem_maintenance failed: permission denied for function idem_maintenance (SQLSTATE 42501)' "$dir/refused.err")" -ge "$1" ]; }
if wait_until 20 refusals 3; then ok "refused: each pass is logged as a warning and the next one made"
else not_ok "refused: each pass is logged as a warning and the next one made"; show_err refused; fi
enqueue t_refused
expect_delivered "refused: still delivering after the failures" 20 t_refused 2 refused
stop_relay "$refused_pid" 20
status=$?
check "refused: SIGTERM exits 0 (status $status)" test "$status" -eq 0

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
