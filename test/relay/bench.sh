#!/usr/bin/env bash
# idem-relay benchmark (not a test; it never fails on a number), on a
# throwaway cluster with durable commits, a NATS server with JetStream and a
# RabbitMQ node of its own (broker_servers.sh; 127.0.0.1 only, stopped
# afterwards). bench.py prints, side by side in one run:
#   - throughput on one backlog of BENCH_RELAY_EVENTS (100000) events, the
#     same for every run, --batch BENCH_RELAY_BATCH (100), first without a
#     key, then over 1000 keys: the hand-written FOR UPDATE SKIP LOCKED loop
#     (test/bench/hand_loop.cpp; over keys also in the form that keeps
#     per-key order) to stdout, the extension's outbox_claim + outbox_ack in
#     SQL (pgbench), idem-relay to stdout, to JetStream and to RabbitMQ, the
#     ratios to the hand loop of the same semantics, and where the CPU goes
#     (relay, PostgreSQL, broker);
#   - distinct keys (a key per event): the hand loops and idem-relay to
#     stdout;
#   - one hot key: the same backlog of one key against the backlog without
#     a key, idem-relay to stdout (runs: --run-length, 100 by default);
#   - scaling: hand loops, --parallel and several relays on the backlog
#     without a key;
#   - commit-to-delivery delay (median, p99) at a steady BENCH_RATE (1000)
#     events/s for BENCH_RELAY_SECONDS (10) s, to stdout and both brokers.
# Run as root after make install. Settings: BENCH_RELAY_PORT (54500: the
# cluster; the brokers take the next four), BENCH_RELAY_ROUNDS (3, the
# median is shown), BENCH_HTTP (1: also the local Python HTTP receiver),
# BENCH_RELAY_SECTIONS (all: unkeyed keyed distinct hot scaling http
# latency; e.g. "distinct hot" runs those two).
# Without nats-server or rabbitmq-server that broker is left out.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"
. "$here/harness.sh"
. "$here/broker_servers.sh"

broker_setup "${BENCH_RELAY_PORT:-54500}"
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

[ -x "$relay_bin" ] || { echo "idem-relay not found at $relay_bin: run make install first" >&2; exit 1; }
$python -c 'import psycopg2' 2>/dev/null || { echo "bench needs python3-psycopg2" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-relay-bench.XXXXXX") || exit 1
chmod 755 "$dir"
receiver_pid=
cleanup() {
    [ -n "$receiver_pid" ] && kill "$receiver_pid" 2>/dev/null
    stop_brokers
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The hand-written loop, built here against the same libpq.
g++ -std=c++17 -O2 -o "$dir/hand_loop" "$here/../bench/hand_loop.cpp" \
    -I"$("$(pg_config_path)" --includedir)" -L"$("$(pg_config_path)" --libdir)" -lpq ||
    { echo "cannot build the hand-written loop" >&2; exit 1; }

start_cluster "$dir" "$port" "log_min_messages = warning" "shared_buffers = 256MB" \
    "synchronous_commit = on" "max_wal_size = 4GB" "max_connections = 50" ||
    { cat "$dir/server.log" >&2; exit 1; }
db=bench
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || exit 1
{ echo "CREATE EXTENSION idempotency; CREATE SCHEMA bench;"; cat "$here/../bench/outbox_baselines.sql"; } |
    sql >/dev/null || exit 1

broker_args=()
prepare_brokers || exit 1
if command -v nats-server >/dev/null && start_nats; then
    $brokers nats-stream "$nats_port" BENCH 'bench.>' || exit 1
    broker_args+=(--nats-port "$nats_port" --nats-pid "$(pgrep -u nats -f -- "-p $nats_port" | head -n 1)")
else
    echo "(NATS left out: nats-server missing or not starting)"
fi
if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && start_rabbitmq; then
    $brokers amqp-queue "$amqp_port" orders && $brokers amqp-queue "$amqp_port" lat_amqp || exit 1
    broker_args+=(--amqp-port "$amqp_port" --amqp-pid "$(pgrep -u rabbitmq beam.smp | head -n 1)")
else
    echo "(RabbitMQ left out: rabbitmq-server missing or not starting)"
fi

if [ "${BENCH_HTTP:-0}" = 1 ]; then
    $python "$here/receiver.py" --port-file "$dir/receiver.port" --log "$dir/receiver.jsonl" &
    receiver_pid=$!
    wait_until 10 test -s "$dir/receiver.port" || { echo "receiver did not start" >&2; exit 1; }
    broker_args+=(--http "http://127.0.0.1:$(cat "$dir/receiver.port")/events")
fi

# The extension's claim and ack in SQL, one transaction per batch.
cat >"$dir/sql_loop.sql" <<SQL
BEGIN;
SELECT idempotency.outbox_ack(coalesce(array_agg(id), '{}')) FROM idempotency.outbox_claim('bench-sql', ${BENCH_RELAY_BATCH:-100});
COMMIT;
SQL

echo "idem-relay benchmark ($(nproc) cores; PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), durable commits)"
$python "$here/bench.py" --dsn "host=$dir port=$port dbname=$db user=postgres" \
    --relay-dsn "host=$dir port=$port dbname=$db user=postgres" --relay "$relay_bin" \
    --hand-loop "$dir/hand_loop" --pgbench "$bindir/pgbench" --sql-loop "$dir/sql_loop.sql" --postmaster-pid "$dir/data/postmaster.pid" "${broker_args[@]}" \
    --events "${BENCH_RELAY_EVENTS:-100000}" --batch "${BENCH_RELAY_BATCH:-100}" \
    --rounds "${BENCH_RELAY_ROUNDS:-3}" --rate "${BENCH_RATE:-1000}" --seconds "${BENCH_RELAY_SECONDS:-10}" \
    ${BENCH_RELAY_SECTIONS:+--sections "$BENCH_RELAY_SECTIONS"}
