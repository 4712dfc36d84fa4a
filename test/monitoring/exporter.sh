#!/usr/bin/env bash
# monitoring/postgres_exporter.yml against a real prometheus-postgres-exporter
# (Debian's): a throwaway cluster with keys and events in every state, a role
# given only idempotency.grant_monitoring(), the exporter scraping it with
# the queries file; every metric of the file must be there, and its values
# must be what the views and idem_metrics say. Ends with "N passed, N failed".
# EXPORTER_PORT (54480, the cluster), EXPORTER_HTTP_PORT (19187).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/test/lib/common.sh"

port=${EXPORTER_PORT:-54480}
http_port=${EXPORTER_HTTP_PORT:-19187}
exporter=$(command -v prometheus-postgres-exporter) || { echo "prometheus-postgres-exporter is missing"; echo "0 passed, 1 failed"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-exporter.XXXXXX")
chmod 755 "$dir"
bindir=$(pg_bindir)
exporter_pid=
cleanup() {
    [ -n "$exporter_pid" ] && kill "$exporter_pid" 2>/dev/null && wait "$exporter_pid" 2>/dev/null
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT

# The workers off: nothing changes the rows between the scrape and the check.
start_cluster "$dir" "$port" "idempotency.worker_enabled = off" || { cat "$dir/server.log"; echo "0 passed, 1 failed"; exit 1; }
psql_as() {  # psql_as ROLE SQL...
    local role=$1; shift
    as_pg "$bindir/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U "$role" -d exporter "$@"
}
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres exporter || exit 1

# Keys in every state, a mismatch, events pending, in flight, delivered and
# dead, a monitoring role with nothing but grant_monitoring.
psql_as postgres -o /dev/null <<'SQL' || { echo "0 passed, 1 failed"; exit 1; }
CREATE EXTENSION idempotency;
CREATE ROLE grafana LOGIN;
SELECT idempotency.grant_monitoring('grafana');
SELECT idempotency.idem_register('r-1', scope => 'exp');
SELECT idempotency.idem_claim('p-' || n, lease => '1 hour', scope => 'exp') FROM generate_series(1, 3) n;
SELECT idempotency.idem_claim('stuck-1', lease => '1 ms', scope => 'exp');
SELECT idempotency.idem_complete('c-' || n, (idempotency.idem_claim('c-' || n, '{"a": 1}', scope => 'exp')).token,
                                 '{"ok": true}', 'exp') FROM generate_series(1, 5) n;
SELECT idempotency.idem_claim('c-1', '{"a": 2}', scope => 'exp');
SELECT idempotency.idem_fail('f-1', (idempotency.idem_claim('f-1', scope => 'exp')).token, 'no', false, scope => 'exp');
SELECT idempotency.outbox_enqueue('exp.orders', jsonb_build_object('n', n)) FROM generate_series(1, 4) n;
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim('relay', 1, '1 hour', '{exp.orders}')));
SELECT count(*) FROM idempotency.outbox_claim('relay', 1, '1 hour', '{exp.orders}');
SELECT idempotency.outbox_enqueue('exp.dead', '{}');
SELECT idempotency.outbox_nack(id, 'gone', false) FROM idempotency.outbox_claim('relay', 1, '1 hour', '{exp.dead}');
SELECT pg_sleep(0.1);
SQL

# The exporter, as the monitoring role, with only the project's queries.
(cd "$dir" && DATA_SOURCE_NAME="host=$dir port=$port user=grafana dbname=exporter sslmode=disable" \
    exec "$exporter" --web.listen-address="127.0.0.1:$http_port" \
    --extend.query-path="$root/monitoring/postgres_exporter.yml" \
    --disable-default-metrics --disable-settings-metrics) >"$dir/exporter.log" 2>&1 &
exporter_pid=$!
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$http_port/metrics" -o "$dir/metrics.txt" && break
    sleep 0.1
done

# What the views say, read as the superuser, beside the scrape.
psql_as postgres -F '|' >"$dir/expected.txt" <<'SQL'
SELECT 'idempotency_keys_' || k.col || '{scope="' || s.scope || '"}', k.val
  FROM idempotency.idem_stats s,
       LATERAL (VALUES ('received', s.received), ('processing', s.processing), ('completed', s.completed),
                       ('failed_retryable', s.failed_retryable), ('failed_final', s.failed_final),
                       ('stuck', s.stuck)) k(col, val)
 WHERE s.scope = 'exp';
SELECT 'idempotency_outbox_' || k.col || '{topic="' || l.topic || '"}', k.val
  FROM idempotency.outbox_lag l,
       LATERAL (VALUES ('pending', l.pending), ('in_flight', l.in_flight), ('retrying', l.retrying),
                       ('dead', l.dead)) k(col, val);
SELECT 'idempotency_stuck_keys{scope="exp",status="PROCESSING"}', count(*) FROM idempotency.idem_stuck;
SELECT 'idempotency_metrics_' || k.col, k.val
  FROM idempotency.idem_metrics m,
       LATERAL (VALUES ('claims', m.claims), ('mismatches', m.mismatches), ('completions', m.completions),
                       ('failures_final', m.failures_final), ('outbox_enqueued', m.outbox_enqueued),
                       ('outbox_delivered', m.outbox_delivered), ('outbox_dead', m.outbox_dead),
                       ('processing_count', m.processing_count)) k(col, val);
SELECT 'idempotency_processing_ms_bucket{le="+Inf"}', processing_count FROM idempotency.idem_metrics;
SQL

python3 - "$dir/metrics.txt" "$dir/expected.txt" "$root/monitoring/postgres_exporter.yml" <<'PY'
import re, sys
scraped, expected_file, queries = sys.argv[1:4]
series = {}
for line in open(scraped, encoding="utf-8"):
    if line.startswith("#") or not line.strip():
        continue
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)', line)
    if not m:
        continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
    labels.pop("server", None)
    key = m.group(1) + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    series[key] = float(m.group(4))
passed = failed = 0
def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what)
    if ok: passed += 1
    else: failed += 1
# Every metric the file defines is exported.
names, query = [], None
for line in open(queries, encoding="utf-8"):
    q = re.match(r'^(\w+):\s*$', line)
    if q: query = q.group(1)
    u = re.match(r'^\s+- (\w+):\s*$', line)
    if u and query: names.append([query, u.group(1), None])
    g = re.match(r'^\s+usage: "(\w+)"', line)
    if g and names: names[-1][2] = g.group(1)
for query, column, usage in names:
    if usage == "LABEL": continue
    name = f"{query}_{column}"
    check(any(k == name or k.startswith(name + "{") for k in series), f"exported: {name}")
# Their values are the views'.
for line in open(expected_file, encoding="utf-8"):
    if not line.strip(): continue
    key, value = line.rstrip("\n").rsplit("|", 1)
    got = series.get(key)
    check(got is not None and value != "" and abs(got - float(value)) < 1e-9,
          f"{key} = {value or 'NULL'} (scraped {got})")
check(series.get("pg_up") == 1.0, "pg_up = 1: the exporter reached the cluster")
check(series.get("pg_exporter_last_scrape_error", 0.0) == 0.0, "no scrape error")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
status=$?
if grep -qi "error" "$dir/exporter.log"; then
    echo "exporter log:"; grep -i error "$dir/exporter.log" | head -20
    [ "$status" -eq 0 ] && { echo "0 passed, 1 failed"; status=1; }
fi
exit "$status"
