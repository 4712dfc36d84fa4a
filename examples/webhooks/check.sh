#!/usr/bin/env bash
# The webhooks example end to end: a throwaway cluster, a partner endpoint
# on 127.0.0.1 that loses responses on purpose (partner.py), the shop
# enqueuing order webhooks in its business transactions (app.py), idem-relay
# delivering them with --parallel 4 and a 3 s lease, stopped with SIGTERM
# mid-run and started again, its metrics scraped once; then the
# reconciliation (reconcile.py) finds the poison event in the dead letters,
# the partner is fixed, the event redriven, and the reconciliation finds
# both sides in sync. verify.py checks the details. Exits non-zero on any
# failure. Needs the extension and idem-relay installed (make install) and
# python3-psycopg2; builds nothing.
# Settings: WEBHOOKS_PORT (54464, names the cluster's socket), WEBHOOKS_SEED
# (the partner's misbehaviour), EXAMPLE_KEEP=1 keeps the cluster's folder
# (with the logs and the partner's store) when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

python=/usr/bin/python3
topic=webhooks.fulfilment

example_start webhooks "${WEBHOOKS_PORT:-54464}" shop
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
example_sql -d shop >/dev/null <<'SQL' || example_fail "setup failed"
-- Quick retries for the scenario: the outbox's backoff from 200 ms, at most 2 s.
ALTER DATABASE shop SET idempotency.retry_base_delay = '200ms';
ALTER DATABASE shop SET idempotency.retry_max_delay = '2s';
-- The relay's role: the relay's functions, and outbox_lag for its progress
-- lines and lag gauge.
CREATE ROLE relay LOGIN;
SELECT idempotency.grant_relay('relay');
-- On call: the views (outbox_lag, outbox_dead_letters).
CREATE ROLE oncall LOGIN IN ROLE pg_monitor;
SQL

work=$EXAMPLE_DIR/work
mkdir -p "$work"
conn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE"
oncall_sql() { example_psql -At -U oncall -c "$1"; }
undelivered() {
    oncall_sql "SELECT coalesce(sum(pending + in_flight + retrying), 0) FROM idempotency.outbox_lag
                 WHERE topic = '$topic'"
}

log "webhooks: starting the partner"
example_bg "$work/partner.log" "$python" "$here/partner.py" serve --store "$work/partner.sqlite" \
    --port-file "$work/partner.port" --seed "${WEBHOOKS_SEED:-1}"
partner_pid=${EXAMPLE_PIDS[-1]}
example_wait_for 20 test -s "$work/partner.port" || example_fail "the partner did not start"
partner=http://127.0.0.1:$(cat "$work/partner.port")

# --http-timeout 1s: the partner's hang and slow (2.5 s) outlast it.
relay=("$(pg_bindir)/idem-relay" --dsn "$conn user=relay" --relay shop-relay --sink "$partner/webhooks"
       --topics "$topic" --batch 16 --lease 3s --http-timeout 1s --parallel 4 --poll-interval 500ms
       --progress-interval 2s --metrics-addr 127.0.0.1:0)

log "webhooks: starting idem-relay and the shop"
example_bg "$work/relay-1.log" "${relay[@]}"
relay_pid=${EXAMPLE_PIDS[-1]}
example_bg "$work/app.log" "$python" "$here/app.py" --dsn "$conn user=app" --orders 40 --threads 4 \
    --log "$work/events.jsonl"
app_pid=${EXAMPLE_PIDS[-1]}

# Mid-run: once a third of the events are committed, SIGTERM the relay; it
# stops claiming, finishes the deliveries in flight, acks or nacks them and
# exits 0. The shop goes on enqueuing; a second run picks everything up.
committed() { example_psql -At -c "SELECT count(*) FROM order_events"; }
a_third() { [ "$(committed)" -ge 40 ]; }
example_wait_for 60 a_third || example_fail "the shop did not commit 40 events"
kill -0 "$app_pid" 2>/dev/null || example_fail "the shop finished before the restart: not mid-run"
log "webhooks: $(committed) events committed; SIGTERM to idem-relay"
example_stop "$relay_pid" 10
status=$?
[ "$status" -eq 0 ] || example_fail "idem-relay exited $status on SIGTERM (expected 0 after draining)"
grep -q 'stopping: no more claims' "$work/relay-1.log" || example_fail "idem-relay did not log its drain"
sleep 1
waiting=$(undelivered)
log "webhooks: no relay running; $waiting event(s) wait in the outbox; starting idem-relay again"
[ "$waiting" -gt 0 ] || example_fail "nothing waited in the outbox while the relay was down: not mid-run"
example_bg "$work/relay-2.log" "${relay[@]}"
relay_pid=${EXAMPLE_PIDS[-1]}

wait "$app_pid" || example_fail "app.py failed"
log "webhooks: the shop is done: $(committed) events committed; waiting for the outbox to settle"
settled() { [ "$(undelivered)" = 0 ]; }
example_wait_for 90 settled || example_fail "the outbox did not settle: $(undelivered) event(s) still undelivered"

# The relay's metrics, scraped once.
metrics_url=$(grep -o 'metrics on http://127\.0\.0\.1:[0-9]*/metrics' "$work/relay-2.log" | head -n 1 | sed 's/^metrics on //')
[ -n "$metrics_url" ] || example_fail "no metrics address in the relay's log"
scrape() { "$python" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode(), end="")' "$1"; }
scrape "$metrics_url" >"$work/metrics.txt" || example_fail "scraping $metrics_url failed"
scrape "${metrics_url%/metrics}/healthz" >"$work/healthz.txt" || example_fail "the relay's /healthz failed"
echo "idem-relay metrics ($metrics_url), the counters of the second run:"
grep -E '^idem_relay_(claimed|delivered|retried|dead|skipped)_total|^idem_relay_(in_flight|db_connected|outbox_lag_seconds)\{' \
    "$work/metrics.txt" | sed 's/^/  /'
grep -Eq '^idem_relay_delivered_total\{relay="shop-relay"\} [1-9]' "$work/metrics.txt" &&
    grep -Eq '^idem_relay_retried_total\{relay="shop-relay"\} [1-9]' "$work/metrics.txt" &&
    grep -q '^idem_relay_db_connected{relay="shop-relay"} 1' "$work/metrics.txt" &&
    grep -q '^idem_relay_delivery_seconds_bucket' "$work/metrics.txt" &&
    grep -qx 'ok' "$work/healthz.txt" || example_fail "unexpected metrics"

# The poison event: the partner answered 400, so the relay nacked it as final
# (after a 500 or 503 or two, maybe: those are retried).
poison=evt_refunded_ref-019
dead=$(oncall_sql "SELECT attempts || ' ' || last_error FROM idempotency.outbox_dead_letters
                    WHERE topic = '$topic' AND dedup_key = '$poison'")
echo "dead letter $poison: $dead"
case $dead in
    [1-9]" HTTP 400"*"unknown refund reason"*) ;;
    *) example_fail "the poison event is not in outbox_dead_letters with its 400 (got: '$dead')" ;;
esac

admin="$conn user=postgres"
log "webhooks: reconciliation (expected: the dead letter outstanding, exit 2)"
example_run "$python" "$here/reconcile.py" --dsn "$admin" --partner "$partner" --wait 30 \
    --json "$work/reconcile-1.json" >"$work/reconcile-1.txt"
status=$?
cat "$work/reconcile-1.txt"
[ "$status" -eq 2 ] || example_fail "reconcile.py exited $status before the fix (expected 2: outstanding)"
grep -q "outbox_redrive(ARRAY\[" "$work/reconcile-1.txt" || example_fail "reconcile.py did not show the redrive"

log "webhooks: fixing the partner, then reconcile.py --redrive (expected: in sync, exit 0)"
example_run "$python" "$here/partner.py" fix --url "$partner" || example_fail "the partner's fix failed"
example_run "$python" "$here/reconcile.py" --dsn "$admin" --partner "$partner" --wait 30 --redrive \
    --json "$work/reconcile-2.json" >"$work/reconcile-2.txt"
status=$?
cat "$work/reconcile-2.txt"
[ "$status" -eq 0 ] || example_fail "reconcile.py --redrive exited $status (expected 0: in sync)"

log "webhooks: SIGTERM to idem-relay"
example_stop "$relay_pid" 10
status=$?
[ "$status" -eq 0 ] || example_fail "idem-relay exited $status on SIGTERM"

example_run "$python" "$here/verify.py" --dsn "$admin" --partner "$partner" --workdir "$work" ||
    example_fail "webhooks checks failed"
example_stop "$partner_pid" 5 >/dev/null
echo "webhooks: all checks passed"
