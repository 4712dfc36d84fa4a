#!/usr/bin/env bash
# Renders docs/monitoring-dashboard.png: the panels of
# monitoring/grafana-dashboard.json drawn from a real run. A throwaway
# cluster (background workers on) serves a shop that claims and completes
# keys (duplicates, a mismatch now and then, failures, work held longer
# than idempotency.stuck_after) and enqueues events that idem-relay
# delivers to a local HTTP receiver (some retried, some dead); the relay
# stops for a minute halfway. Debian's prometheus-postgres-exporter (with
# monitoring/postgres_exporter.yml) and the relay's /metrics are scraped
# by a local Prometheus every 2 s, and monitoring/render.py draws each
# panel's queries from it. About RENDER_SECONDS (360) s; as root (it
# installs prometheus and python3-matplotlib when missing).
#   RENDER_OUT (docs/monitoring-dashboard.png), RENDER_PORT (54490)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$root/test/lib/common.sh"

seconds=${RENDER_SECONDS:-360}
out=${RENDER_OUT:-$root/docs/monitoring-dashboard.png}
port=${RENDER_PORT:-54490}
IDEM_PACKAGES="$IDEM_PACKAGES prometheus prometheus-postgres-exporter python3-matplotlib curl"
ensure_packages || exit 1
build_and_install || exit 1
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-render.XXXXXX")
chmod 755 "$dir"
pids=()
# Each process and the one runuser started for it.
stop_pid() {
    local pid=$1 child
    for child in $(pgrep -P "$pid"); do kill "$child" 2>/dev/null; done
    kill "$pid" 2>/dev/null
}
cleanup() {
    local pid
    for pid in "${pids[@]}"; do stop_pid "$pid"; done
    wait 2>/dev/null
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
exporter_port=$(free_port)
relay_port=$(free_port)
prometheus_port=$(free_port)

start_cluster "$dir" "$port" "idempotency.naptime = '1s'" "max_connections = 50" || exit 1
psql_shop() { as_pg "$bindir/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d shop "$@"; }
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres shop || exit 1
psql_shop -o /dev/null <<'SQL' || exit 1
CREATE EXTENSION idempotency;
CREATE ROLE grafana LOGIN;
SELECT idempotency.grant_monitoring('grafana');
CREATE ROLE relay LOGIN;
SELECT idempotency.grant_relay('relay');
ALTER DATABASE shop SET idempotency.stuck_after = '20s';
CREATE TABLE abandoned (key text PRIMARY KEY, token bigint NOT NULL);
SQL

# The receiver, the relay, the exporter, Prometheus.
as_pg python3 "$root/test/relay/receiver.py" --port-file "$dir/receiver.port" --log "$dir/receiver.log" \
    >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do [ -s "$dir/receiver.port" ] && break; sleep 0.1; done
sink="http://127.0.0.1:$(cat "$dir/receiver.port")/events"
start_relay() {
    as_pg "$bindir/idem-relay" --dsn "host=$dir port=$port dbname=shop user=relay" --relay relay-1 \
        --sink "$sink" --all-topics --batch 50 --parallel 4 --poll-interval 200ms \
        --progress-interval 2s --metrics-addr "127.0.0.1:$relay_port" >>"$dir/relay.log" 2>&1 &
    relay_pid=$!
    pids+=($relay_pid)
}
start_relay
(cd "$dir" && DATA_SOURCE_NAME="host=$dir port=$port user=grafana dbname=shop sslmode=disable" \
    exec prometheus-postgres-exporter --web.listen-address="127.0.0.1:$exporter_port" \
    --extend.query-path="$root/monitoring/postgres_exporter.yml" --disable-default-metrics \
    --disable-settings-metrics) >"$dir/exporter.log" 2>&1 &
pids+=($!)
cat >"$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 2s
scrape_configs:
  - job_name: postgres
    static_configs: [{targets: ['127.0.0.1:$exporter_port']}]
  - job_name: idem-relay
    static_configs: [{targets: ['127.0.0.1:$relay_port']}]
YAML
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
    --web.listen-address="127.0.0.1:$prometheus_port" >"$dir/prometheus.log" 2>&1 &
pids+=($!)

# The shop: each transaction claims a new key and completes it (1 in 20
# fails, 1 in 100 is abandoned with a short lease: the workers expire it,
# and it is completed late at the end), 1 in 3 asks again for a key already
# done (a replay; 1 in 400 with another request: a mismatch), and enqueues
# an event of its customer (1 in 25 fails once at the receiver; 1 in 400, without
# a key, for good).
cat >"$dir/shop.sql" <<'SQL'
\set n random(1, 1000000000)
\set old random(1, 1000)
\set roll random(1, 400)
BEGIN;
SELECT coalesce((idempotency.idem_claim('order-' || :n, jsonb_build_object('n', :n),
        lease => CASE WHEN :roll % 100 = 50 THEN interval '1s' END, scope => 'checkout')).token, 0) AS token \gset
INSERT INTO abandoned SELECT 'order-' || :n, :token WHERE :roll % 100 = 50 AND :token <> 0;
SELECT CASE WHEN :token = 0 THEN 'not claimed'
            WHEN :roll % 100 = 50 THEN 'abandoned'
            WHEN :roll % 20 = 0
            THEN (idempotency.idem_fail('order-' || :n, :token, 'card declined', scope => 'checkout'))::text
            ELSE (idempotency.idem_complete('order-' || :n, :token, '{"ok": true}', 'checkout')).outcome END;
SELECT idempotency.idem_claim('order-' || (:n % 1000 + 1), jsonb_build_object('n', :n % 1000 + 1 + CASE WHEN :roll = 6 THEN 1 ELSE 0 END), scope => 'checkout')
 WHERE :roll % 3 = 0;
SELECT idempotency.outbox_enqueue(CASE WHEN :roll % 3 = 0 THEN 'invoices' ELSE 'orders' END,
    CASE WHEN :roll = 1 THEN '{"script": ["400"]}'::jsonb
         WHEN :roll % 25 = 0 THEN '{"script": ["503", "200"]}'::jsonb
         ELSE jsonb_build_object('order', :n) END, CASE WHEN :roll <> 1 THEN 'customer-' || :old END);
COMMIT;
SQL
# Keys claimed by name first, so that the replays find them done.
psql_shop -o /dev/null -c "SELECT idempotency.idem_complete('order-' || n, (idempotency.idem_claim('order-' || n, jsonb_build_object('n', n), scope => 'checkout')).token, '{}', 'checkout') FROM generate_series(1, 1000) n" || exit 1
chmod 644 "$dir/shop.sql"
start=$(date +%s)
log "render: the shop runs for ${seconds}s (the relay stops for a minute halfway)"
as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c 4 -j 2 -R 40 -T "$seconds" \
    -f "$dir/shop.sql" shop >"$dir/pgbench.log" 2>&1 &
shop_pid=$!
pids+=($shop_pid)
# Long work: 30 keys held past stuck_after, then finished.
sleep $((seconds / 6))
psql_shop -o /dev/null -c "CREATE TABLE held AS SELECT n, (idempotency.idem_claim('report-' || n, lease => '1 hour', scope => 'reports')).token FROM generate_series(1, 30) n"
sleep $((seconds / 6))
stop_pid "$relay_pid"
sleep 60
start_relay
sleep $((seconds / 6))
psql_shop -o /dev/null -c "SELECT idempotency.idem_complete('report-' || n, token, '{}', 'reports') FROM held"
wait "$shop_pid"
# The abandoned keys' holders come back: late completions.
psql_shop -o /dev/null -c "SELECT idempotency.idem_complete(key, token, '{}', 'checkout') FROM abandoned"
sleep 6
end=$(date +%s)
/usr/bin/python3 "$here/render.py" "$here/grafana-dashboard.json" "http://127.0.0.1:$prometheus_port" "$start" "$end" "$out" ||
    { tail -20 "$dir/prometheus.log" "$dir/exporter.log" "$dir/relay.log"; exit 1; }
log "render: $out"
