#!/usr/bin/env bash
# The monitoring views under steady traffic: BENCH_TRAFFIC_KEYS (10,000,000)
# finished keys loaded, then pgbench claims and completes new keys with
# 5-minute leases at BENCH_TRAFFIC_RATE (2,000) transactions a second for
# BENCH_TRAFFIC_SECONDS (300), with the workers and autovacuum on, as a
# server runs. Every BENCH_TRAFFIC_SCRAPE seconds (5) a scraper (one
# session, kept open) reads idem_stats, idem_stuck and outbox_lag, and the
# keys finished but not yet settled (still in the live keys' index). Prints Markdown on stdout: per
# view the median, p99 and worst read over the run. Target: every view
# <= 10 ms at any moment.
#
# Environment: BENCH_TRAFFIC_KEYS, BENCH_TRAFFIC_RATE, BENCH_TRAFFIC_SECONDS,
# BENCH_TRAFFIC_SCRAPE, BENCH_TRAFFIC_PORT (54437). Run by `make bench`
# (section views_traffic) or alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

keys=${BENCH_TRAFFIC_KEYS:-10000000}
rate=${BENCH_TRAFFIC_RATE:-2000}
seconds=${BENCH_TRAFFIC_SECONDS:-300}
scrape=${BENCH_TRAFFIC_SCRAPE:-5}
port=${BENCH_TRAFFIC_PORT:-54437}
target_ms=10

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-traffic.XXXXXX")
cleanup() {
    kill "${traffic:-}" 2>/dev/null
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 512MB" "max_wal_size = 8GB" "max_connections = 50" ||
    { cat "$dir/server.log" >&2; exit 1; }
psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}

psql_bench -c "CREATE EXTENSION idempotency" || exit 1
# The history: finished keys over 10 scopes, loaded directly in chunks of
# a million (as a restore would), then counted by the worker.
from=0
while [ "$from" -lt "$keys" ]; do
    next=$((from + 1000000 < keys ? from + 1000000 : keys))
    psql_bench -c "
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at, purge_at)
SELECT 's' || g % 10, 'done-' || g, 'COMPLETED', g, 1, '{\"status\": 200}', now(), now(), now(),
       now() + interval '10 years', now() + interval '10 years'
  FROM generate_series($((from + 1)), $next) g" || exit 1
    from=$next
done
psql_bench -c "VACUUM ANALYZE idempotency.idempotency_keys" -c "SELECT idempotency.request_sweep()" \
    -c "CHECKPOINT" >/dev/null || exit 1

psql_bench <<'SQL' || exit 1
CREATE FUNCTION read_ms(view text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT * FROM idempotency.%I) v', view);
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1000;
END $$;
SQL

# The traffic: claim a new key with a 5-minute lease and complete it, one
# transaction, at a fixed rate.
printf '%s\n' '\set n random(1, 1000000000000)' '\set s :client_id % 10' \
    "SELECT token FROM idempotency.idem_claim('new-' || :client_id || '-' || :n, NULL, interval '5 minutes', 's' || :s) \gset" \
    "SELECT idempotency.idem_complete('new-' || :client_id || '-' || :n, :token, '{\"status\": 200}', 's' || :s);" \
    >"$dir/traffic.sql"
chmod 644 "$dir/traffic.sql"
as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c 8 -j 2 -M prepared -R "$rate" \
    -T "$seconds" -f "$dir/traffic.sql" postgres >"$dir/traffic.log" 2>&1 &
traffic=$!

# The scrapes, from one session kept open as a monitoring scraper keeps
# its connection (psql's \watch): each view read, then the finished keys
# not yet settled, one transaction per scrape.
psql_bench <<'SQL' || exit 1
CREATE TABLE scrapes (scrape int, view text, ms float8);
CREATE TABLE unsettled (scrape int, n bigint);
CREATE SEQUENCE scrape_number;
CREATE FUNCTION scrape_once() RETURNS void LANGUAGE plpgsql AS $$
DECLARE n int := nextval('scrape_number');
BEGIN
    INSERT INTO scrapes SELECT n, v, read_ms(v) FROM unnest('{idem_stats,idem_stuck,outbox_lag}'::text[]) v;
    INSERT INTO unsettled SELECT n, count(*) FROM idempotency.idempotency_keys
     WHERE active_since IS NOT NULL AND status NOT IN ('RECEIVED', 'PROCESSING');
END $$;
SQL
printf 'SELECT scrape_once() \\watch %s\n' "$scrape" |
    as_pg timeout "$seconds" "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q >/dev/null 2>&1
psql_bench -c "SELECT view, ms FROM scrapes" | tr '|' ' ' >"$dir/scrapes"
max_unsettled=$(psql_bench -c "SELECT coalesce(max(n), 0) FROM unsettled")
# Each view's worst read, with the finished keys waiting at that scrape.
worst_reads=$(psql_bench -F ' ' -c "SELECT DISTINCT ON (s.view) s.view, round(s.ms::numeric, 2), u.n
    FROM scrapes s JOIN unsettled u USING (scrape) ORDER BY s.view, s.ms DESC")
wait "$traffic"
tps=$(sed -nE 's/^tps = ([0-9.]+) \(without.*/\1/p' "$dir/traffic.log")
[ -n "$tps" ] || { echo "views_traffic: the traffic failed:" >&2; tail -20 "$dir/traffic.log" >&2; exit 1; }

echo "| view | reads | median | p99 | worst |"
echo "|---|---:|---:|---:|---:|"
worst_all=0
for view in idem_stats idem_stuck outbox_lag; do
    read -r n median p99 worst < <(awk -v v="$view" '$1 == v { print $2 }' "$dir/scrapes" | sort -g |
        awk '{ t[NR] = $1 } END { printf "%d %.2f %.2f %.2f\n", NR, t[int((NR + 1) / 2)], t[int(NR * 0.99 + 0.999)], t[NR] }')
    echo "| \`$view\` | $n | $median ms | $p99 ms | $worst ms |"
    worst_all=$(awk -v a="$worst_all" -v b="$worst" 'BEGIN { print (b > a ? b : a) }')
done
echo
echo "$keys finished keys loaded, then claim + complete of new keys (5-minute leases) at $(printf '%.0f' "$tps")" \
    "transactions/s (asked: $rate) for $seconds s, workers and autovacuum on, a scrape every $scrape s."
echo "Finished keys not yet settled, at most: $max_unsettled. Each view's worst read, and the finished" \
    "keys waiting at that scrape: $(awk '{ printf "%s%s %s ms (%s)", sep, $1, $2, $3; sep = ", " }' <<<"$worst_reads")."
verdict=$(awk -v w="$worst_all" -v t="$target_ms" 'BEGIN { print (w <= t ? "met" : "MISSED") }')
echo "Target: every view <= $target_ms ms at any moment; worst read ${worst_all} ms: $verdict."
