#!/usr/bin/env bash
# idem-relay against the real brokers: a throwaway cluster, a NATS server
# with JetStream (as the OS user nats) and a RabbitMQ node (as the OS user
# rabbitmq, with its own node name, Erlang port mapper and data folder), all
# on 127.0.0.1 ports of their own and stopped afterwards. Scenarios, for
# each broker:
#
#   order      --parallel 4 --once: every event arrives once, in per-key
#              order, with the idempotency key as Nats-Msg-Id / message_id
#              (its dedup_key where it has one), RabbitMQ's persistent
#   lanes      the same with --connections 2 --parallel 2
#   kill       the relay is SIGKILLed while events it published are not
#              acked in the outbox (caught by freezing it until the broker
#              holds more than the outbox has acked); the next relay
#              publishes them again: the JetStream stream holds each event
#              once (the PubAcks said duplicate), RabbitMQ's repeats carry
#              the same message_id; every event arrives, per-key order
#   outage     the broker stops under a running relay: deliveries fail and
#              are retried (attempts counted, the error stored), nothing is
#              acked; after the broker restarts every event arrives (each
#              once in the stream), those from before the stop kept
#   drain      SIGTERM: exit 0 in bounds, nothing left in flight, exactly
#              the events acked are at the broker
#   RabbitMQ only:
#   unroutable a message no queue takes (mandatory) is not acked: it is
#              retried, delivered once its queue exists, dead after
#              idempotency.outbox_max_attempts
#   nack       a queue that refuses publishes (x-overflow reject-publish):
#              the nacked event is retried, delivered once there is room
#   alarm      a memory alarm blocks the connection (set_vm_memory_high_watermark
#              0.0001) with 40 events of 200 kB to publish: the relay reads
#              RabbitMQ's connection.blocked and publishes nothing more, the
#              events released within --http-timeout with no attempt counted,
#              no lease runs out while its event is in flight, SIGTERM exits 0
#              within --http-timeout + 5 s; once the alarm clears the running
#              relay delivers them all, copies only of those published before
#              the block was read
#   misconfigured  wrong NATS credentials (a second NATS server that wants a
#              user and password), a subject no JetStream stream takes, a
#              wrong RabbitMQ password, a missing vhost, a missing exchange:
#              the running relay stops by itself with exit 1 and says why,
#              every event stays pending with no attempt counted
#   window     a JetStream stream whose duplicate window (0.2 s) is shorter
#              than the lease plus the retry delay: a warning at start
#   tls        NATS (wanting a client certificate) and RabbitMQ over TLS with
#              a private CA: untrusted, the relay stops (exit 1, nothing
#              charged); with --ca-file (and --client-cert, --client-key)
#              every event arrives
#
# Run as root after the extension and idem-relay are installed (make
# install); needs nats-server, rabbitmq-server, python3-pika and an
# idem-relay built with libnats-dev and librabbitmq-dev. Prints "ok N - ..."
# or "not ok N - ..." lines and ends with "N passed, N failed". Settings:
# BROKER_TEST_PORT (54460: PostgreSQL; NATS, AMQP, the RabbitMQ node's
# distribution port, its port mapper, a NATS server with a password, one
# over TLS and RabbitMQ's TLS listener take the next seven), IDEM_RELAY.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"
. "$here/harness.sh"
. "$here/broker_servers.sh"

broker_setup "${BROKER_TEST_PORT:-54460}"
db=broker_test
passed=0
failed=0
number=0
pids=()

unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-brokers.XXXXXX") || exit 1
chmod 755 "$dir"

cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; kill -CONT "$pid" 2>/dev/null; done
    stop_brokers
    stop_cluster "$dir"
    if [ "$failed" -eq 0 ] && [ -z "${RELAY_TEST_KEEP:-}" ]; then
        rm -rf "$dir"
    else
        echo "outputs kept in $dir" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

give_up() { echo "brokers: $1" >&2; [ $# -gt 1 ] && tail -n 20 "$2" >&2; echo "$passed passed, $((failed + 1)) failed"; exit 1; }

# ---------------------------------------------------------------- setup
[ -x "$relay_bin" ] || give_up "idem-relay not found at $relay_bin: run make install first"
for tool in nats-server /usr/lib/rabbitmq/bin/rabbitmq-server epmd; do
    command -v "$tool" >/dev/null || give_up "$tool is missing (install nats-server and rabbitmq-server)"
done
$python -c 'import pika' 2>/dev/null || give_up "python3-pika is missing"
log "broker tests: cluster in $dir, ports $port-$epmd_port"
start_cluster "$dir" "$port" "log_min_messages = warning" "max_connections = 40" ||
    give_up "could not start the cluster" "$dir/server.log"
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || give_up "createdb failed"
sql <<'SQL' || give_up "setup failed"
CREATE EXTENSION idempotency;
CREATE ROLE relay_app LOGIN;
SELECT idempotency.grant_relay('relay_app');
-- Short backoffs keep the retries quick; an outage must not kill events.
ALTER DATABASE broker_test SET idempotency.retry_base_delay = '100ms';
ALTER DATABASE broker_test SET idempotency.retry_max_delay = '500ms';
ALTER DATABASE broker_test SET idempotency.outbox_max_attempts = 1000;
SQL
dsn="host=$dir port=$port dbname=$db user=relay_app"

command -v openssl >/dev/null || give_up "openssl is missing"
make_test_ca "$dir/tls" || give_up "openssl could not make a private CA"
prepare_brokers || give_up "cannot prepare the brokers' folders"

for scheme in nats amqp; do
    "$relay_bin" --relay r --sink "$scheme://127.0.0.1:1" --all-topics --once >/dev/null 2>"$dir/built.err" </dev/null
    grep -q "built without" "$dir/built.err" && give_up "idem-relay was built without the $scheme:// sink" "$dir/built.err"
done

log "starting NATS (JetStream) on 127.0.0.1:$nats_port"
start_nats || give_up "NATS did not start" "$dir/nats/server.log"
log "starting RabbitMQ on 127.0.0.1:$amqp_port"
started=$SECONDS
start_rabbitmq || give_up "RabbitMQ did not start" "$dir/rabbitmq/server.out"
log "RabbitMQ up after $((SECONDS - started)) s"
nats_sink="nats://127.0.0.1:$nats_port/outbox"
amqp_sink="amqp://guest:guest@127.0.0.1:$amqp_port/"

# ---------------------------------------------------------------- helpers
# enqueue TOPIC COUNT KEYS: COUNT events over KEYS keys (every 7th without a
# key, every 5th with a dedup_key); writes $dir/TOPIC.ids ("id message-id").
enqueue() {
    local topic=$1 count=$2 keys=$3
    sql -c "SELECT idempotency.outbox_enqueue('$topic',
                jsonb_build_object('seq', g, 'pad', repeat('x', 200)),
                CASE WHEN g % 7 = 0 THEN NULL ELSE 'k' || (g % $keys) END,
                '{\"X-Custom\": \"yes\"}',
                CASE WHEN g % 5 = 0 THEN '$topic-' || g END)
            FROM generate_series(1, $count) g" >/dev/null
    write_ids "$topic"
}
write_ids() {
    sql -F ' ' -c "SELECT id, coalesce(dedup_key, 'outbox-' || id) FROM idempotency.outbox
                    WHERE topic = '$1' ORDER BY id" >"$dir/$1.ids"
}
delivered_at_least() { [ "$(delivered "$1")" -ge "$2" ]; }
delivered() { sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = '$1' AND state = 'delivered'"; }
all_delivered() { sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = '$1' AND state <> 'delivered'" 0; }
# retried_while_down TOPIC REGEX [FIRST-ID]: of the events from FIRST-ID on,
# some attempted at least twice and failed with an error that REGEX
# matches, none delivered.
retried_while_down() {
    sql_is "SELECT count(*) FILTER (WHERE attempts >= 2 AND state = 'pending' AND last_error ~ '$2') > 0
                   AND count(*) FILTER (WHERE state = 'delivered') = 0
              FROM idempotency.outbox WHERE topic = '$1' AND id >= ${3:-0}" t
}
# catch_unacked PID APP TOPIC COUNT-COMMAND...: freezes the relay (SIGSTOP)
# until its backend runs no statement, then compares what the broker holds
# with what the outbox has acked; SIGKILLs the relay once the broker holds
# more (events published, their acks not committed), else lets it go on
# and looks again. Sets caught to "held acked".
catch_unacked() {
    local pid=$1 app=$2 topic=$3 held acked deadline=$((SECONDS + 120))
    shift 3
    while [ "$SECONDS" -lt "$deadline" ]; do
        kill -STOP "$pid" 2>/dev/null || return 1
        if wait_until 10 sql_is "SELECT count(*) FROM pg_stat_activity
                                  WHERE application_name = '$app' AND state = 'active'" 0; then
            held=$("$@")
            acked=$(delivered "$topic")
            if [ -n "$held" ] && [ "$held" -gt "$acked" ]; then
                kill -KILL "$pid"
                caught="$held $acked"
                return 0
            fi
        fi
        kill -CONT "$pid"
        wait_until 5 grows_beyond "${held:-0}" "$@"
    done
    return 1
}
grows_beyond() { local n=$1 now; shift; now=$("$@"); [ -n "$now" ] && [ "$now" -gt "$n" ]; }
# final_line NAME: the relay's last progress line.
final_line() { grep 'stopped:' "$dir/$1.err" | tail -n 1; }

# ---------------------------------------------------------------- scenarios
# The scenarios' topics start with the broker's initial: n_..., r_...
topic_of() { local initial=${1:0:1}; echo "${initial,,}"; }
# run_order BROKER SINK NAME "OPTIONS" DUMP-COMMAND...: the order scenario
# (topic x_NAME) with the relay's OPTIONS; the dump command gets the output
# file as its last argument.
run_order() {
    local broker=$1 sink=$2 name=$3 options=$4 topic=$(topic_of "$1")_$3
    shift 4
    enqueue "$topic" 1200 30
    # shellcheck disable=SC2086 # OPTIONS are words
    once "${topic}1" 120 --dsn "$dsn" --sink "$sink" --topics "$topic" $options --batch 50
    local status=$?
    check "$broker $name: --once $options exits 0 ($(states "$topic"))" \
        test "$status" -eq 0 -a "$(states "$topic")" = "delivered=1200"
    "$@" "$dir/$topic.dump"
    local verdict
    verdict=$($brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once)
    check "$broker $name: every event once, per-key order, the idempotency key as message id ($verdict)" \
        $brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once
}

run_kill() {
    local broker=$1 sink=$2 count_command=$3 topic=$(topic_of "$1")_kill once_flag=$4
    shift 4
    # Enough events that the relay is still publishing when it is caught: a
    # relay that drained them all before the first look leaves nothing
    # between publish and ack to catch.
    enqueue "$topic" 20000 50
    start_relay "${topic}1" --dsn "$dsn application_name=${topic}1" --sink "$sink" --topics "$topic" \
        --parallel 2 --batch 50 --lease 3s --http-timeout 1s --progress-interval 0
    local pid=$relay_pid
    caught="0 0"
    if catch_unacked "$pid" "${topic}1" "$topic" $count_command; then
        wait "$pid" 2>/dev/null
        ok "$broker kill: SIGKILLed with ${caught% *} event(s) at the broker and ${caught#* } acked"
    else
        not_ok "$broker kill: caught the relay between publish and ack"; show_err "${topic}1"
        kill -KILL "$pid" 2>/dev/null; kill -CONT "$pid" 2>/dev/null
    fi
    start_relay "${topic}2" --dsn "$dsn" --sink "$sink" --topics "$topic" --parallel 2 --batch 50 \
        --lease 3s --http-timeout 1s --progress-interval 0
    local pid2=$relay_pid
    if wait_until 120 all_delivered "$topic"; then ok "$broker kill: the next relay delivers every event"
    else not_ok "$broker kill: the next relay delivers every event" "$(states "$topic")"; show_err "${topic}2"; fi
    stop_relay "$pid2" 20
    check "$broker kill: SIGTERM exits 0" test $? -eq 0
    "$@" "$dir/$topic.dump"
    local verdict
    verdict=$($brokers check "$dir/$topic.dump" "$dir/$topic.ids" $once_flag)
    check "$broker kill: every event arrived, per-key order, repeats with the same message id ($verdict)" \
        $brokers check "$dir/$topic.dump" "$dir/$topic.ids" $once_flag
    kill_final=$(final_line "${topic}2")
}

# run_outage BROKER SINK STOP START PATTERN DUMP-COMMAND...
run_outage() {
    local broker=$1 sink=$2 stop=$3 start=$4 pattern=$5 topic=$(topic_of "$1")_outage
    shift 5
    enqueue "$topic" 100 10
    start_relay "${topic}1" --dsn "$dsn" --sink "$sink" --topics "$topic" --parallel 2 --batch 20 \
        --lease 5s --http-timeout 1s --progress-interval 0
    local pid=$relay_pid
    wait_until 60 all_delivered "$topic"
    check "$broker outage: delivered before the stop ($(states "$topic"))" all_delivered "$topic"
    "$stop"
    local first
    first=$(sql -c "SELECT min(idempotency.outbox_enqueue('$topic', jsonb_build_object('seq', 1000 + g), 'k' || (g % 10)))
                      FROM generate_series(1, 100) g")
    write_ids "$topic"
    if wait_until 60 retried_while_down "$topic" "$pattern" "$first"; then
        ok "$broker outage: while it is down, deliveries fail and are retried, none acked"
    else
        not_ok "$broker outage: while it is down, deliveries fail and are retried, none acked" "$(states "$topic")"
        sql -c "SELECT attempts, state, last_error FROM idempotency.outbox WHERE topic = '$topic' AND id >= $first ORDER BY id LIMIT 3"
    fi
    check "$broker outage: the relay keeps running" kill -0 "$pid"
    "$start"
    check "$broker outage: $broker restarted" test $? -eq 0
    if wait_until 120 all_delivered "$topic"; then ok "$broker outage: after the restart every event is delivered"
    else not_ok "$broker outage: after the restart every event is delivered" "$(states "$topic")"; show_err "${topic}1"; fi
    stop_relay "$pid" 20
    check "$broker outage: SIGTERM exits 0" test $? -eq 0
    "$@" "$dir/$topic.dump"
    local verdict
    verdict=$($brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once)
    check "$broker outage: each event once at the broker, those from before the stop kept ($verdict)" \
        $brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once
}

# run_drain BROKER SINK DUMP-COMMAND...
run_drain() {
    local broker=$1 sink=$2 topic=$(topic_of "$1")_drain
    shift 2
    enqueue "$topic" 20000 100
    # Small claims: many transactions, so that SIGTERM finds some open.
    start_relay "${topic}1" --dsn "$dsn" --sink "$sink" --topics "$topic" --parallel 2 --batch 5 \
        --lease 20s --http-timeout 5s --progress-interval 0
    local pid=$relay_pid
    wait_until 60 delivered_at_least "$topic" 200
    local started=$SECONDS
    stop_relay "$pid" 20
    local status=$?
    local acked; acked=$(delivered "$topic")
    check "$broker drain: SIGTERM exits 0 in $((SECONDS - started)) s, $acked of 20000 acked" \
        test "$status" -eq 0 -a "$acked" -lt 20000
    check "$broker drain: nothing left in flight" \
        sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = '$topic' AND state = 'in_flight'" 0
    sql -F ' ' -c "SELECT id, coalesce(dedup_key, 'outbox-' || id) FROM idempotency.outbox
                    WHERE topic = '$topic' AND state = 'delivered' ORDER BY id" >"$dir/$topic.ids"
    "$@" "$dir/$topic.dump"
    local verdict
    verdict=$($brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once)
    check "$broker drain: the broker holds exactly the events acked ($verdict)" \
        $brokers check "$dir/$topic.dump" "$dir/$topic.ids" --once
    check "$broker drain: it said so on stderr" grep -q "stopping" "$dir/${topic}1.err"
}

# ---------------------------------------------------------------- NATS
log "NATS JetStream"
for topic in n_order n_lanes n_kill n_outage n_drain; do
    $brokers nats-stream "$nats_port" "${topic^^}" "outbox.$topic" || give_up "cannot create stream ${topic^^}"
done
run_order NATS "$nats_sink" order "--parallel 4" $brokers nats-dump "$nats_port" N_ORDER
run_order NATS "$nats_sink" lanes "--connections 2 --parallel 2" $brokers nats-dump "$nats_port" N_LANES
subjects=$($python -c "import json,sys; print(sorted({json.loads(l)['subject'] for l in open(sys.argv[1])}))" "$dir/n_order.dump")
check "NATS order: published to the subject prefix.topic ($subjects)" test "$subjects" = "['outbox.n_order']"
check "NATS order: the payload and the event's own headers arrive" $python -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if all(l['payload']['pad'] == 'x' * 200 and l['headers'].get('X-Custom') == 'yes' for l in lines) else 1)" "$dir/n_order.dump"

run_kill NATS "$nats_sink" "$brokers nats-count $nats_port N_KILL" --once $brokers nats-dump "$nats_port" N_KILL
# The events the stream held unacked were all published again, and the
# stream answered that it had them.
duplicates=$(sed -nE 's/.* duplicates=([0-9]+).*/\1/p' <<<"$kill_final")
unacked=$((${caught% *} - ${caught#* }))
check "NATS kill: the $unacked unacked events published again, the stream said duplicate (duplicates=${duplicates:-?})" \
    test "${duplicates:-0}" -ge "$unacked" -a "$unacked" -gt 0

run_outage NATS "$nats_sink" stop_nats start_nats 'NATS|PubAck' $brokers nats-dump "$nats_port" N_OUTAGE
run_drain NATS "$nats_sink" $brokers nats-dump "$nats_port" N_DRAIN

# One stream for two topics that use the same dedup_keys (the outbox keeps
# a dedup_key unique within its topic): 20 distinct events, none dropped by
# JetStream as the repeat of another.
$brokers nats-stream "$nats_port" N_SHARED outbox.n_shared_a outbox.n_shared_b || give_up "cannot create stream N_SHARED"
sql -c "SELECT idempotency.outbox_enqueue(t, jsonb_build_object('seq', g), 'k' || g, NULL, 'order-' || g)
          FROM generate_series(1, 10) g, unnest(ARRAY['n_shared_a', 'n_shared_b']) t" >/dev/null
once n_shared 60 --dsn "$dsn" --sink "$nats_sink" --topics n_shared_a,n_shared_b
check "NATS shared stream: two topics with the same dedup_keys, all 20 in the stream, none counted duplicate ($(final_line n_shared | grep -o 'duplicates=[0-9]*'))" \
    test "$($brokers nats-count "$nats_port" N_SHARED)" = 20 -a "$(final_line n_shared | grep -o 'duplicates=[0-9]*')" = duplicates=0

# A message larger than the stream's max_msg_size can never be stored: dead
# at once with JetStream's reason, not retried through every attempt while
# its key's next events wait.
$brokers nats-stream-max-msg-size "$nats_port" N_SMALL 600 outbox.n_small || give_up "cannot create stream N_SMALL"
sql -c "SELECT idempotency.outbox_enqueue('n_small', jsonb_build_object('seq', g, 'pad', repeat('x', CASE WHEN g = 2 THEN 1000 ELSE 10 END)), 'one')
          FROM generate_series(1, 3) g" >/dev/null
once n_small 60 --dsn "$dsn" --sink "$nats_sink" --topics n_small
check "NATS max_msg_size: the larger event dead after one attempt with JetStream's reason, the one before it delivered ($(states n_small))" \
    sql_is "SELECT string_agg(state || ':' || attempts, ' ' ORDER BY id) || ' '
                   || bool_and(last_error LIKE '%message size exceeds maximum%') FILTER (WHERE state = 'dead')
              FROM idempotency.outbox WHERE topic = 'n_small'" "delivered:1 dead:1 pending:0 true"

# ---------------------------------------------------------------- RabbitMQ
log "RabbitMQ"
for topic in r_order r_lanes r_kill r_outage r_drain; do
    $brokers amqp-queue "$amqp_port" "$topic" || give_up "cannot declare queue $topic"
done
run_order RabbitMQ "$amqp_sink" order "--parallel 4" $brokers amqp-dump "$amqp_port" r_order
run_order RabbitMQ "$amqp_sink" lanes "--connections 2 --parallel 2" $brokers amqp-dump "$amqp_port" r_lanes
check "RabbitMQ order: persistent messages with the payload and the event's own headers" $python -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if all(l['persistent'] and l['payload']['pad'] == 'x' * 200 and l['headers'].get('X-Custom') == 'yes'
                  for l in lines) else 1)" "$dir/r_order.dump"

run_kill RabbitMQ "$amqp_sink" "$brokers amqp-count $amqp_port r_kill" "" $brokers amqp-dump "$amqp_port" r_kill
repeated=$(sed -nE 's/.* ([0-9]+) repeated$/\1/p' <<<"$($brokers check "$dir/r_kill.dump" "$dir/r_kill.ids")")
unacked=$((${caught% *} - ${caught#* }))
check "RabbitMQ kill: the $unacked unacked events published again arrived twice ($repeated), with the same message_id" \
    test "${repeated:-0}" -ge "$unacked" -a "$unacked" -gt 0

run_outage RabbitMQ "$amqp_sink" stop_rabbitmq start_rabbitmq 'RabbitMQ|AMQP' $brokers amqp-dump "$amqp_port" r_outage
run_drain RabbitMQ "$amqp_sink" $brokers amqp-dump "$amqp_port" r_drain

log "RabbitMQ: a message over max_message_size among others of its group"
# RabbitMQ closes the channel on it, losing the group's confirms: the big
# one is dead at its first attempt, the others of other keys delivered.
rabbitmqctl_test eval 'application:set_env(rabbit, max_message_size, 4096).' >/dev/null ||
    give_up "cannot set RabbitMQ's max_message_size"
$brokers amqp-queue "$amqp_port" r_big || give_up "cannot declare queue r_big"
sql -c "SELECT idempotency.outbox_enqueue('r_big', jsonb_build_object('seq', g, 'pad', repeat('x', CASE WHEN g = 2 THEN 10000 ELSE 10 END)),
                                          'b' || g) FROM generate_series(1, 4) g" >/dev/null
start_relay r_big --dsn "$dsn" --sink "$amqp_sink" --topics r_big --lease 5s --http-timeout 1s --progress-interval 0
if wait_until 60 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_big' AND state IN ('delivered', 'dead')" 4 &&
    sql_is "SELECT string_agg(state::text, ',' ORDER BY id) FROM idempotency.outbox WHERE topic = 'r_big'" \
        "delivered,dead,delivered,delivered" &&
    sql_is "SELECT attempts FROM idempotency.outbox WHERE topic = 'r_big' AND state = 'dead'" 1; then
    ok "RabbitMQ max_message_size: the message over it dead at its first attempt, the other keys' delivered"
else
    not_ok "RabbitMQ max_message_size: the message over it dead at its first attempt, the other keys' delivered" \
        "$(sql -c "SELECT id, state, attempts, last_error FROM idempotency.outbox WHERE topic = 'r_big' ORDER BY id")"
    show_err r_big
fi
check "RabbitMQ max_message_size: the dead letter says why" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_big' AND state = 'dead' AND last_error LIKE '%max_message_size%'" 1
stop_relay "$relay_pid" 20
rabbitmqctl_test eval 'application:set_env(rabbit, max_message_size, 134217728).' >/dev/null

log "RabbitMQ: an event whose headers do not fit in one AMQP frame"
# The properties travel in one frame of at most frame_max (128 kB): such an
# event is dead before it is published, and the connection goes on with
# the others of its group. Before, the failed publish broke the connection
# and the event was retried as "connection lost" until its attempts ran out.
$brokers amqp-queue "$amqp_port" r_headers || give_up "cannot declare queue r_headers"
sql -c "SELECT idempotency.outbox_enqueue('r_headers', jsonb_build_object('seq', g), 'h' || g,
          headers => CASE WHEN g = 2 THEN jsonb_build_object('x-big', repeat('y', 200000)) ELSE '{}' END)
          FROM generate_series(1, 3) g" >/dev/null
start_relay r_headers --dsn "$dsn" --sink "$amqp_sink" --topics r_headers --lease 5s --http-timeout 1s --progress-interval 0
if wait_until 60 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_headers' AND state IN ('delivered', 'dead')" 3 &&
    sql_is "SELECT string_agg(state || ' ' || attempts, ',' ORDER BY id) FROM idempotency.outbox WHERE topic = 'r_headers'" \
        "delivered 1,dead 1,delivered 1"; then
    ok "RabbitMQ headers over frame_max: that event dead at its first attempt, the others delivered"
else
    not_ok "RabbitMQ headers over frame_max: that event dead at its first attempt, the others delivered" \
        "$(sql -c "SELECT id, state, attempts, last_error FROM idempotency.outbox WHERE topic = 'r_headers' ORDER BY id")"
    show_err r_headers
fi
check "RabbitMQ headers over frame_max: the dead letter gives the sizes" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_headers' AND state = 'dead' AND last_error LIKE '%frame_max%'" 1
check "RabbitMQ headers over frame_max: the queue holds the two others" test "$($brokers amqp-count "$amqp_port" r_headers)" = 2
stop_relay "$relay_pid" 20

log "RabbitMQ: unroutable messages and nacks"
sql -c "SELECT idempotency.outbox_enqueue('r_nowhere', '{\"seq\": 1}', 'n')" >/dev/null
start_relay unroutable --dsn "$dsn" --sink "$amqp_sink" --topics r_nowhere,r_full --lease 5s \
    --http-timeout 1s --progress-interval 0
unroutable_pid=$relay_pid
if wait_until 60 retried_while_down r_nowhere unroutable; then
    ok "RabbitMQ unroutable: not acked, retried with the reason stored"
else
    not_ok "RabbitMQ unroutable: not acked, retried with the reason stored" "$(states r_nowhere)"
    sql -c "SELECT attempts, state, last_error FROM idempotency.outbox WHERE topic = 'r_nowhere'"
fi
$brokers amqp-queue "$amqp_port" r_nowhere
wait_until 60 all_delivered r_nowhere
check "RabbitMQ unroutable: delivered once a queue takes it ($(states r_nowhere))" all_delivered r_nowhere
check "RabbitMQ unroutable: the queue holds it once" test "$($brokers amqp-count "$amqp_port" r_nowhere)" = 1

# A queue that holds one message and refuses more: the broker nacks.
$brokers amqp-queue "$amqp_port" r_full 1
sql -c "SELECT idempotency.outbox_enqueue('r_full', jsonb_build_object('seq', g), 'f' || g) FROM generate_series(1, 2) g" >/dev/null
wait_until 60 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_full' AND state = 'pending'
                       AND attempts >= 2 AND last_error LIKE '%nacked%'" 1
check "RabbitMQ nack: the event the full queue refused is retried ($(states r_full))" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_full' AND state = 'pending'
             AND attempts >= 2 AND last_error LIKE '%nacked%'" 1
$brokers amqp-dump "$amqp_port" r_full "$dir/r_full.first"
wait_until 60 all_delivered r_full
check "RabbitMQ nack: delivered once the queue has room ($(states r_full))" all_delivered r_full
stop_relay "$unroutable_pid" 20
check "RabbitMQ unroutable: SIGTERM exits 0" test $? -eq 0

# Past idempotency.outbox_max_attempts an unroutable event is a dead letter.
sql -c "SELECT idempotency.outbox_enqueue('r_nowhere2', '{\"seq\": 1}')" >/dev/null
start_relay unroutable2 --dsn "$dsn options='-c idempotency.outbox_max_attempts=2'" --sink "$amqp_sink" \
    --topics r_nowhere2 --http-timeout 1s --lease 5s --progress-interval 0
unroutable2_pid=$relay_pid
wait_until 60 sql_is "SELECT state FROM idempotency.outbox WHERE topic = 'r_nowhere2'" dead
check "RabbitMQ unroutable: dead after outbox_max_attempts (here 2: $(states r_nowhere2))" \
    sql_is "SELECT state || ' ' || attempts FROM idempotency.outbox WHERE topic = 'r_nowhere2'" "dead 2"
stop_relay "$unroutable2_pid" 20
check "RabbitMQ unroutable: the dead letter says why" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_nowhere2' AND last_error LIKE '%unroutable%'" 1

# ---------------------------------------------------------------- alarm
log "RabbitMQ memory alarm: publishing paused with no attempt counted, leases kept, SIGTERM in time, resumed"
$brokers amqp-queue "$amqp_port" r_alarm || give_up "cannot declare queue r_alarm"
alarmed() { rabbitmqctl_test eval 'rabbit_alarm:get_alarms().' 2>/dev/null | grep -q memory; }
rabbitmqctl_test set_vm_memory_high_watermark 0.0001 >"$dir/alarm.out" 2>&1
if wait_until 60 alarmed; then ok "alarm: RabbitMQ raised its memory alarm"
else not_ok "alarm: RabbitMQ raised its memory alarm" "$(tail -n 5 "$dir/alarm.out")"; fi
sql -c "SELECT idempotency.outbox_enqueue('r_alarm', jsonb_build_object('seq', g, 'pad', repeat('x', 200000)), 'a' || g)
          FROM generate_series(1, 40) g" >/dev/null
start_relay r_alarm1 --dsn "$dsn" --sink "$amqp_sink" --topics r_alarm --batch 40 --http-timeout 2s --lease 10s \
    --progress-interval 0
alarm_pid=$relay_pid
# held_back RELAY: the groups it released unpublished because RabbitMQ
# blocked its connection.
held_back() { grep -c 'not published, no attempt counted' "$dir/$1.err"; }
# published_while_blocked RELAY: the events it published before it read
# RabbitMQ's connection.blocked, and those published on a connection cut
# before it could (the broker may store them once the alarm clears: the
# copies an alarm may add).
published_while_blocked() {
    local held cut
    held=$(grep -o '[0-9]*: published, not confirmed: RabbitMQ has blocked' "$dir/$1.err" |
        awk -F: '{ n += $1 } END { print n + 0 }')
    cut=$(grep -c 'failed, will be retried: published, not confirmed' "$dir/$1.err")
    echo $((held + cut))
}
# attempts_counted: the attempts of r_alarm's events, not counting those of
# the events in flight right now (a claim counts one, a release gives it
# back).
counted_sql="SELECT sum(attempts) - count(*) FILTER (WHERE state = 'in_flight') FROM idempotency.outbox WHERE topic = 'r_alarm'"
attempts_counted() { sql -c "$counted_sql"; }
# in_flight_overdue: events in flight whose lease has run out (another relay
# could take them over while they are still being published).
overdue=0
paused_after() {
    local n
    n=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 'r_alarm' AND state = 'in_flight' AND lease_until < now()")
    [ "${n:-0}" -gt "$overdue" ] && overdue=$n
    [ "$(held_back r_alarm1)" -ge "$1" ]
}
# Once the relay has read the notice it keeps the connection and counts no
# attempt. A publish cut before (its write blocked before the notice could be
# read: on a busy machine, for large messages) counts its attempt, as a
# publish the broker does not read.
if wait_until 60 paused_after 1; then
    counted=$(attempts_counted)
    if wait_until 60 paused_after 3; then
        ok "alarm: the blocked connection publishes nothing, group after group (released within --http-timeout)"
    else
        not_ok "alarm: the blocked connection publishes nothing, group after group (released within --http-timeout)" \
            "$(states r_alarm)" "$(tail -n 5 "$dir/r_alarm1.err")"
    fi
    check "alarm: no attempt counted once the relay read the notice, no event dead ($counted before, $(attempts_counted) after; $(states r_alarm))" \
        sql_is "SELECT ($counted_sql) = $counted AND NOT EXISTS (SELECT FROM idempotency.outbox WHERE topic = 'r_alarm' AND state = 'dead')" t
else
    not_ok "alarm: the relay reads RabbitMQ's notice and holds the events back" "$(states r_alarm)" "$(tail -n 5 "$dir/r_alarm1.err")"
fi
check "alarm: the relay says RabbitMQ blocked the connection, and why" \
    grep -q 'RabbitMQ blocked the connection (low on memory): publishing paused' "$dir/r_alarm1.err"
check "alarm: no event in flight past its lease (at most $overdue seen)" test "$overdue" -eq 0
started=$SECONDS
stop_relay "$alarm_pid" 30
status=$?
took=$((SECONDS - started))
check "alarm: SIGTERM exits 0 within --http-timeout + 5 s while blocked (status $status, $took s)" \
    test "$status" -eq 0 -a "$took" -le 7
check "alarm: nothing acked while blocked, nothing left in flight ($(states r_alarm))" \
    sql_is "SELECT count(*) FILTER (WHERE state IN ('delivered', 'in_flight')) FROM idempotency.outbox WHERE topic = 'r_alarm'" 0
# A relay that is running when the alarm clears publishes again on the
# connection RabbitMQ unblocks.
start_relay r_alarm2 --dsn "$dsn" --sink "$amqp_sink" --topics r_alarm --batch 40 --http-timeout 2s --lease 10s \
    --progress-interval 0
alarm_pid=$relay_pid
check "alarm: a relay started during the alarm is blocked too" \
    wait_until 60 grep -q 'RabbitMQ blocked the connection' "$dir/r_alarm2.err"
rabbitmqctl_test set_vm_memory_high_watermark 0.4 >>"$dir/alarm.out" 2>&1
not_alarmed() { ! alarmed; }
wait_until 60 not_alarmed
expect_delivered "alarm: once the alarm clears, the running relay delivers every event" 120 r_alarm 40 r_alarm2
check "alarm: the relay says RabbitMQ unblocked the connection" \
    grep -q 'RabbitMQ unblocked the connection after' "$dir/r_alarm2.err"
stop_relay "$alarm_pid" 20
copies=$(( $(published_while_blocked r_alarm1) + $(published_while_blocked r_alarm2) ))
held=$($brokers amqp-count "$amqp_port" r_alarm)
check "alarm: the queue holds every event, plus at most one copy of each published before the block was read ($held messages, $copies published so)" \
    test "${held:-0}" -ge 40 -a "${held:-0}" -le $((40 + copies))

# ---------------------------------------------------------------- misconfigured
# A broker that refuses the configuration refuses every event alike: the
# relay stops (exit 1), says why, and charges no attempt.
log "misconfigured brokers: refused credentials, vhost, missing stream and exchange"
# misconfigured NAME SINK TOPIC PATTERN: 5 events of TOPIC, a running relay
# that must stop by itself.
misconfigured() {
    local name=$1 sink=$2 topic=$3 pattern=$4
    sql -c "SELECT idempotency.outbox_enqueue('$topic', jsonb_build_object('seq', g), 'm' || (g % 2))
              FROM generate_series(1, 5) g" >/dev/null
    start_relay "$topic" --dsn "$dsn" --sink "$sink" --topics "$topic" --lease 5s --http-timeout 1s \
        --connect-timeout 1s --progress-interval 0
    own_exit "$relay_pid" 30
    local row
    row=$(sql -c "SELECT count(*) FILTER (WHERE state = 'pending' AND attempts = 0) FROM idempotency.outbox WHERE topic = '$topic'")
    if [ "$status" = 1 ] && grep -qE "$pattern" "$dir/$topic.err" && [ "$row" = 5 ]; then
        ok "misconfigured $name: the relay stops with exit 1 and says why, the 5 events pending with no attempt"
    else
        not_ok "misconfigured $name: the relay stops with exit 1 and says why, the 5 events pending with no attempt" \
            "status $status, pending without attempts: $row" "$(sql -c "SELECT state, attempts, last_error FROM idempotency.outbox WHERE topic = '$topic' LIMIT 2")"
        show_err "$topic" 5
        [ "$status" = running ] && stop_relay "$relay_pid" 20
    fi
}
# start_nats NAME PORT ARGS...: a NATS server of its own on PORT, logging
# to $dir/nats/NAME.log, until it answers: its JetStream when ARGS has -js
# (IDEM_NATS_TLS set for one that wants TLS), else its port. One that does
# not answer within 60 s is started once more (its port may have been
# taken for a moment by another connection), then the run gives up with
# its log.
tcp_open() { bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
start_nats() {
    local name=$1 port=$2 try answers=tcp_open
    shift 2
    case " $* " in *" -js "*) answers="$brokers nats-up" ;; esac
    for try in 1 2; do
        setsid runuser -u nats -- nats-server -a 127.0.0.1 -p "$port" -l "$dir/nats/$name.log" "$@" \
            >/dev/null 2>&1 </dev/null &
        broker_groups+=("$!")
        wait_until 60 $answers "$port" && return 0
        log "the $name NATS server did not answer on port $port within 60 s; its log:"
        tail -n 20 "$dir/nats/$name.log" >&2
        stop_group "${broker_groups[-1]}"
    done
    give_up "the $name NATS server did not start"
}
start_nats auth "$nats_auth_port" --user relay --pass right
misconfigured "NATS credentials" "nats://relay:wrong@127.0.0.1:$nats_auth_port/outbox" n_badauth \
    "NATS refused the relay's credentials"
misconfigured "NATS stream" "$nats_sink" n_nostream "no JetStream stream takes subject outbox.n_nostream"
misconfigured "NATS without JetStream" "nats://relay:right@127.0.0.1:$nats_auth_port/outbox" n_nojs \
    "NATS has no JetStream for the relay's account"
misconfigured "RabbitMQ password" "amqp://guest:wrong@127.0.0.1:$amqp_port/" r_badauth \
    "RabbitMQ refused the relay's login"
misconfigured "RabbitMQ vhost" "amqp://guest:guest@127.0.0.1:$amqp_port/no-such-vhost" r_badvhost \
    "RabbitMQ refused the relay's login.*vhost no-such-vhost"
misconfigured "RabbitMQ exchange" "amqp://guest:guest@127.0.0.1:$amqp_port/?exchange=no-such-exchange" r_badexchange \
    "RabbitMQ has no exchange 'no-such-exchange'"
# A peer that takes the connection, reads the protocol header and closes it
# before any handshake (a load balancer with no broker behind it) is a
# broker out of reach, not a refused login: the relay goes on, retrying.
$python -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True); sys.stdout.close()
while True:
    c, _ = s.accept(); c.recv(8); c.close()' >"$dir/closer.port" &
closer=$!
pids+=("$closer")
wait_until 10 test -s "$dir/closer.port" || give_up "the closing peer did not start"
sql -c "SELECT idempotency.outbox_enqueue('r_closer', jsonb_build_object('seq', g), 'c' || g) FROM generate_series(1, 2) g" >/dev/null
start_relay r_closer --dsn "$dsn" --sink "amqp://guest:guest@127.0.0.1:$(cat "$dir/closer.port")/" --topics r_closer \
    --lease 5s --http-timeout 1s --connect-timeout 1s --progress-interval 0
wait_until 30 grep -q "will be retried" "$dir/r_closer.err"
check "closing peer: not taken for a refused login, its events retried (exit only on SIGTERM)" \
    bash -c '! grep -q "refused the relay" "$1" && grep -q "will be retried" "$1" && kill -0 "$2"' _ "$dir/r_closer.err" "$relay_pid"
stop_relay "$relay_pid" 20
kill "$closer" 2>/dev/null
check "misconfigured: no secret in what the relay printed" \
    bash -c '! grep -qE "wrong|right" "$@"' _ "$dir/n_badauth.err" "$dir/r_badauth.err"

# ---------------------------------------------------------------- window
log "JetStream: a duplicate window shorter than the lease plus the retry delay"
$brokers nats-stream-window "$nats_port" N_WINDOW 0.2 outbox.n_window || give_up "cannot create stream N_WINDOW"
sql -c "SELECT idempotency.outbox_enqueue('n_window', jsonb_build_object('seq', g), 'w' || g) FROM generate_series(1, 3) g" >/dev/null
once n_window 60 --dsn "$dsn" --sink "$nats_sink" --topics n_window --lease 5s --http-timeout 1s
status=$?
check "window: the run delivers (exit $status, $(states n_window))" test "$status" -eq 0 -a "$(states n_window)" = "delivered=3"
check "window: it warns that the stream's duplicate window (0.2 s) is too short" \
    grep -qE "JetStream stream 'N_WINDOW' .* 0\.200 s \(duplicate_window\), shorter than the lease plus the retry delay" "$dir/n_window.err"
check "window: once, not per event" test "$(grep -c "duplicate_window" "$dir/n_window.err")" = 1

# ---------------------------------------------------------------- server list
log "NATS: a list of servers, the first of which does not answer"
$brokers nats-stream "$nats_port" N_LIST outbox.n_list || give_up "cannot create stream N_LIST"
closed_port=$($python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sql -c "SELECT idempotency.outbox_enqueue('n_list', jsonb_build_object('seq', g), 'l' || g) FROM generate_series(1, 3) g" >/dev/null
once n_list 60 --dsn "$dsn" --sink "nats://127.0.0.1:$closed_port,127.0.0.1:$nats_port/outbox" --topics n_list \
    --lease 5s --http-timeout 1s --connect-timeout 1s
status=$?
check "server list: the relay connects to the server that answers and delivers (exit $status, $(states n_list))" \
    test "$status" -eq 0 -a "$(states n_list)" = "delivered=3"

# ---------------------------------------------------------------- tls
log "TLS with a private CA: NATS (client certificate) and RabbitMQ (amqps://)"
mkdir -p "$dir/nats/tls-store" && chown nats "$dir/nats/tls-store"
IDEM_NATS_TLS="$dir/tls" start_nats tls "$nats_tls_port" -js -sd "$dir/nats/tls-store" \
    --tls --tlscert "$dir/tls/server.pem" --tlskey "$dir/tls/server.key" \
    --tlsverify --tlscacert "$dir/tls/ca.pem"
IDEM_NATS_TLS="$dir/tls" $brokers nats-stream "$nats_tls_port" N_TLS outbox.n_tls || give_up "cannot create stream N_TLS over TLS"
tls_options=(--ca-file "$dir/tls/ca.pem" --client-cert "$dir/tls/client.pem" --client-key "$dir/tls/client.key")
misconfigured "NATS untrusted certificate" "nats://127.0.0.1:$nats_tls_port/outbox" n_tls "NATS TLS: "
once n_tls2 60 --dsn "$dsn" --sink "nats://127.0.0.1:$nats_tls_port/outbox" --topics n_tls "${tls_options[@]}"
status=$?
check "tls: NATS with --ca-file and a client certificate delivers every event (exit $status, $(states n_tls))" \
    test "$status" -eq 0 -a "$(states n_tls)" = "delivered=5"
check "tls: the TLS stream holds each once" \
    test "$(IDEM_NATS_TLS="$dir/tls" $brokers nats-count "$nats_tls_port" N_TLS)" = 5
$brokers amqp-queue "$amqp_port" r_tls || give_up "cannot declare queue r_tls"
misconfigured "RabbitMQ untrusted certificate" "amqps://guest:guest@127.0.0.1:$amqps_port/" r_tls \
    "the broker's certificate is not trusted"
once r_tls2 60 --dsn "$dsn" --sink "amqps://guest:guest@127.0.0.1:$amqps_port/" --topics r_tls --ca-file "$dir/tls/ca.pem"
status=$?
check "tls: RabbitMQ over amqps:// with --ca-file delivers every event (exit $status, $(states r_tls))" \
    test "$status" -eq 0 -a "$(states r_tls)" = "delivered=5"
check "tls: the queue holds each once" test "$($brokers amqp-count "$amqp_port" r_tls)" = 5

# ---------------------------------------------------------------- cleanup
log "stopping the brokers"
stop_brokers
if brokers_gone; then
    ok "the brokers are stopped: none of their processes left, none of their ports listening"
else
    not_ok "the brokers are stopped: none of their processes left, none of their ports listening" \
        "$(ps -e -o pid,pgid,stat,user,args | awk -v gs=" ${broker_groups[*]} " 'index(gs, " " $2 " ")')" \
        "$(ss -ltnp | grep -E "127\.0\.0\.1:($nats_port|$amqp_port|$amqp_dist_port|$epmd_port|$nats_auth_port|$nats_tls_port|$amqps_port) ")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
