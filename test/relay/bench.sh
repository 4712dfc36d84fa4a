#!/usr/bin/env bash
# idem-relay benchmark (not a test; it never fails on a number): on a
# throwaway cluster with durable commits and the local HTTP receiver
# (receiver.py, 127.0.0.1 only), prints
#   - end-to-end throughput of a bulk-enqueued backlog delivered by one
#     --once run to stdout and to the receiver, with and without keys;
#   - the delay from the enqueuing transaction's commit (its return to the
#     client) to the event's arrival at the sink, median and p99, at a
#     steady load of BENCH_RATE (200) events/s for BENCH_SECONDS (10) s.
# Run as root after make install. Settings: BENCH_RELAY_PORT (54450),
# BENCH_EVENTS (20000), BENCH_HTTP_EVENTS (5000), BENCH_RATE, BENCH_SECONDS.
# The Python receiver is single-process: HTTP figures are bounded by it.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${BENCH_RELAY_PORT:-54450}
bindir=$(pg_bindir)
relay_bin=${IDEM_RELAY:-$bindir/idem-relay}
python=/usr/bin/python3
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

[ -x "$relay_bin" ] || { echo "idem-relay not found at $relay_bin: run make install first" >&2; exit 1; }
$python -c 'import psycopg2' 2>/dev/null || { echo "bench needs python3-psycopg2" >&2; exit 1; }

dir=$(mktemp -d /tmp/idempotency-relay-bench.XXXXXX) || exit 1
chmod 755 "$dir"
receiver_pid=
cleanup() {
    [ -n "$receiver_pid" ] && kill "$receiver_pid" 2>/dev/null
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "log_min_messages = warning" || { cat "$dir/server.log" >&2; exit 1; }
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
as_pg "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -d bench -v ON_ERROR_STOP=1 \
    -c "CREATE EXTENSION idempotency" || exit 1

$python "$here/receiver.py" --port-file "$dir/receiver.port" --log "$dir/receiver.jsonl" &
receiver_pid=$!
for _ in $(seq 1 100); do [ -s "$dir/receiver.port" ] && break; sleep 0.1; done
[ -s "$dir/receiver.port" ] || { echo "receiver did not start" >&2; exit 1; }

echo "idem-relay benchmark ($(nproc) cores; PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'))"
$python "$here/bench.py" --dsn "host=$dir port=$port dbname=bench user=postgres" \
    --relay-dsn "host=$dir port=$port dbname=bench user=postgres" --relay "$relay_bin" \
    --http "http://127.0.0.1:$(cat "$dir/receiver.port")/events" --receiver-log "$dir/receiver.jsonl" \
    --events "${BENCH_EVENTS:-20000}" --http-events "${BENCH_HTTP_EVENTS:-5000}" \
    --rate "${BENCH_RATE:-200}" --seconds "${BENCH_SECONDS:-10}"
