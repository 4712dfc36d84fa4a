#!/usr/bin/env bash
# idem-relay end to end: a throwaway cluster, a scripted HTTP receiver on
# 127.0.0.1 (receiver.py) and the installed idem-relay, scenario by scenario:
#
#   cli        --help documents every option; bad options exit 2 with a
#              message; an unreachable database or a database without the
#              extension exit 1 with a message
#   stdout     the stdout sink's JSON lines; --once; a delayed event and a
#              rolled-back one are not delivered
#   scripted   200, 204, 409 ack; 500, 408, 425, 503, 429 + Retry-After, a
#              reset connection and a response slower than --http-timeout are
#              retried; 400 and 422 are dead at once; a steady 500 is dead
#              after idempotency.outbox_max_attempts; the event's headers and
#              dedup_key reach the receiver; a retried event holds back the next
#              event of its key
#   refused    connection refused: retried, delivered by a later run
#   order      --parallel 4: deliveries overlap, per-key order holds
#   kill       SIGKILL mid-batch, restart: every event delivered, duplicates
#              only with the same Idempotency-Key
#   restart    pg_ctl restart -m immediate under a running relay and a running
#              enqueuer: nothing committed is lost, nothing rolled back arrives
#   drain      SIGTERM: exit 0 within bounds, nothing left in flight
#   once       --once delivers what is due and exits
#   notify     wakes on LISTEN (poll interval 60 s), progress lines on stderr,
#              Prometheus metrics and /healthz on --metrics-addr
#   final      over the whole run: every committed event delivered (or dead as
#              scripted), never a rolled-back one, per-key order, duplicates
#              only with the same Idempotency-Key
#
# Run as root after the extension and idem-relay are installed (make install);
# it builds and installs nothing. Prints one "ok N - ..." or "not ok N - ..."
# line per check and ends with "N passed, N failed"; exits non-zero on any
# failure. Settings: RELAY_TEST_PORT (54440), IDEM_RELAY (the binary; default
# $(pg_config --bindir)/idem-relay).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${RELAY_TEST_PORT:-54440}
bindir=$(pg_bindir)
relay_bin=${IDEM_RELAY:-$bindir/idem-relay}
python=/usr/bin/python3
db=relay_test
passed=0
failed=0
number=0
pids=()

# The receiver and the relay talk over loopback only; no proxy in between.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

dir=$(mktemp -d /tmp/idempotency-relay.XXXXXX) || exit 1
chmod 755 "$dir"
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    stop_cluster "$dir"
    if [ "$failed" -eq 0 ] && [ -z "${RELAY_TEST_KEEP:-}" ]; then
        rm -rf "$dir"
    else
        echo "outputs kept in $dir" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok() { number=$((number + 1)); passed=$((passed + 1)); echo "ok $number - $1"; }
not_ok() {
    number=$((number + 1)); failed=$((failed + 1)); echo "not ok $number - $1"
    [ $# -gt 1 ] && printf '  %s\n' "${@:2}"
    return 0
}
# check NAME COMMAND...: ok when the command succeeds.
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }

sql() { as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 "$@"; }
# wait_until SECONDS COMMAND...: polls every 0.1 s.
wait_until() {
    local limit=$1; shift
    local deadline=$((SECONDS + limit))
    while ! "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}
sql_is() { [ "$(sql -c "$1" 2>/dev/null)" = "$2" ]; }
received() { grep -c "\"topic\":\"$1\"" "$dir/receiver.jsonl" 2>/dev/null || true; }
received_at_least() { [ "$(received "$1")" -ge "$2" ]; }
live() { sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = '$1' AND state IN ('pending', 'in_flight')"; }
states() {
    sql -c "SELECT coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), '') FROM
            (SELECT state::text, count(*) AS n FROM idempotency.outbox WHERE topic = '$1' GROUP BY 1) s"
}
dump() {
    sql -F '|' -c "SELECT id, topic, coalesce(key, ''), state, attempts, coalesce(payload->>'expect', ''),
                          coalesce(dedup_key, ''), replace(coalesce(last_error, ''), E'\n', ' ')
                     FROM idempotency.outbox ORDER BY id" >"$dir/outbox.dump"
}
# DSN of the application-like role (USAGE on schema idempotency only).
dsn="host=$dir port=$port dbname=$db user=relay_app"

# start_relay NAME ARGS...: runs idem-relay in the background with stdout
# and stderr in $dir/NAME.out and $dir/NAME.err; sets relay_pid. (Not under
# timeout(1), which would pass our signals on twice; every wait below is
# bounded and the cleanup kills what is left.)
start_relay() {
    local name=$1; shift
    "$relay_bin" --relay "$name" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
    relay_pid=$!
    pids+=("$relay_pid")
}
# stop_relay PID SECONDS [SIGNAL]: SIGTERM (or SIGNAL), then the exit status
# (124 when it did not exit in time, and then it is killed).
stop_relay() {
    local pid=$1 limit=$2 signal=${3:-TERM}
    kill -"$signal" "$pid" 2>/dev/null
    local deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.05
    done
    wait "$pid"
}
# once NAME SECONDS ARGS...: a --once run in the foreground; its exit status.
once() {
    local name=$1 limit=$2; shift 2
    timeout -s KILL "$limit" "$relay_bin" --relay "$name" --once "$@" >"$dir/$name.out" 2>"$dir/$name.err"
}
show_err() { echo "  --- $1.err:"; tail -n "${2:-15}" "$dir/$1.err" | sed 's/^/  /'; }

# ---------------------------------------------------------------- setup
[ -x "$relay_bin" ] || { echo "idem-relay not found at $relay_bin: run make install first" >&2; echo "0 passed, 1 failed"; exit 1; }
log "relay tests: cluster in $dir, port $port"
if ! start_cluster "$dir" "$port" "log_min_messages = warning" "max_connections = 40"; then
    echo "relay tests: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    echo "0 passed, 1 failed"
    exit 1
fi
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || { echo "0 passed, 1 failed"; exit 1; }
sql <<'SQL' || { echo "relay tests: setup failed" >&2; echo "0 passed, 1 failed"; exit 1; }
CREATE EXTENSION idempotency;
CREATE ROLE relay_app LOGIN;
GRANT USAGE ON SCHEMA idempotency TO relay_app;
CREATE ROLE relay_monitor LOGIN IN ROLE pg_monitor;
-- Short backoffs and few attempts keep the scripted retries quick.
ALTER DATABASE relay_test SET idempotency.retry_base_delay = '200ms';
ALTER DATABASE relay_test SET idempotency.retry_max_delay = '1s';
ALTER DATABASE relay_test SET idempotency.outbox_max_attempts = 3;
SQL

$python "$here/receiver.py" --port-file "$dir/receiver.port" --log "$dir/receiver.jsonl" \
    2>"$dir/receiver.err" &
pids+=($!)
wait_until 10 test -s "$dir/receiver.port" || { echo "receiver did not start" >&2; cat "$dir/receiver.err" >&2; echo "0 passed, 1 failed"; exit 1; }
sink="http://127.0.0.1:$(cat "$dir/receiver.port")/events"

# ---------------------------------------------------------------- cli
log "command line"
"$relay_bin" --help >"$dir/help.out" 2>&1
status=$?
missing=""
for option in --dsn --relay --sink --topics --batch --lease --parallel --once --metrics-addr \
    --poll-interval --http-timeout --connect-timeout --progress-interval; do
    grep -q -- "$option" "$dir/help.out" || missing="$missing $option"
done
if [ "$status" -eq 0 ] && [ -z "$missing" ]; then ok "--help exits 0 and documents every option"
else not_ok "--help exits 0 and documents every option" "status $status, missing:$missing"; fi

bad_option() {  # bad_option EXPECTED-MESSAGE ARGS...
    local expected=$1; shift
    "$relay_bin" "$@" >"$dir/bad.out" 2>"$dir/bad.err"
    local status=$?
    if [ "$status" -eq 2 ] && grep -qi -- "$expected" "$dir/bad.err"; then
        ok "bad command line exits 2: $*"
    else
        not_ok "bad command line exits 2: $*" "status $status: $(head -c 300 "$dir/bad.err")"
    fi
}
bad_option "--dsn is required"
bad_option "unknown option" --dsn "$dsn" --relay r --sink stdout --bogus
bad_option "--sink is required" --dsn "$dsn" --relay r
bad_option "--batch must be" --dsn "$dsn" --relay r --sink stdout --batch 0
bad_option "--batch must be" --dsn "$dsn" --relay r --sink stdout --batch 10001
bad_option "--parallel must be" --dsn "$dsn" --relay r --sink stdout --parallel many
bad_option "--lease must be" --dsn "$dsn" --relay r --sink stdout --lease 30x
bad_option "--sink must be" --dsn "$dsn" --relay r --sink ftp://example
bad_option "not a valid URL" --dsn "$dsn" --relay r --sink "http://"
bad_option "loopback" --dsn "$dsn" --relay r --sink stdout --metrics-addr 0.0.0.0:9187
bad_option "shorter than --lease" --dsn "$dsn" --relay r --sink stdout --lease 2s --http-timeout 5s
bad_option "needs a value" --dsn "$dsn" --relay r --sink stdout --topics

timeout -s KILL 30 "$relay_bin" --dsn "host=$dir/nowhere port=1 dbname=x connect_timeout=3" \
    --relay r --sink stdout --once >"$dir/unreachable.out" 2>"$dir/unreachable.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "cannot connect to the database" "$dir/unreachable.err"; then
    ok "an unreachable database: a clear message and exit 1"
else
    not_ok "an unreachable database: a clear message and exit 1" "status $status: $(head -c 300 "$dir/unreachable.err")"
fi
timeout -s KILL 30 "$relay_bin" --dsn "host=$dir port=$port dbname=postgres user=postgres" \
    --relay r --sink stdout --once >"$dir/noext.out" 2>"$dir/noext.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "extension is not installed" "$dir/noext.err"; then
    ok "a database without the extension: a clear message and exit 1"
else
    not_ok "a database without the extension: a clear message and exit 1" "status $status: $(head -c 300 "$dir/noext.err")"
fi

sql -c "CREATE ROLE relay_nobody LOGIN" >/dev/null
timeout -s KILL 30 "$relay_bin" --dsn "host=$dir port=$port dbname=$db user=relay_nobody" \
    --relay r --sink stdout --once >"$dir/nousage.out" 2>"$dir/nousage.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "may not use schema idempotency" "$dir/nousage.err"; then
    ok "a role without USAGE on schema idempotency: a clear message and exit 1"
else
    not_ok "a role without USAGE on schema idempotency: a clear message and exit 1" "status $status: $(head -c 300 "$dir/nousage.err")"
fi
timeout -s KILL 30 "$relay_bin" --dsn "$dsn" --relay r --sink stdout --once --lease 48h \
    >"$dir/longlease.out" 2>"$dir/longlease.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "lease" "$dir/longlease.err"; then
    ok "a lease the server refuses (over idempotency.max_lease): its message and exit 1"
else
    not_ok "a lease the server refuses (over idempotency.max_lease): its message and exit 1" "status $status: $(head -c 300 "$dir/longlease.err")"
fi

# ---------------------------------------------------------------- stdout
log "stdout sink"
sql >/dev/null <<'SQL'
SELECT idempotency.outbox_enqueue('s_stdout',
    jsonb_build_object('name', 'plain', 'text', E'line1\nline2 "quoted" \u00e9'), 'k1', '{"h": "v", "n": 5}');
SELECT idempotency.outbox_enqueue('s_stdout', '{"name": "nokey", "list": [1, 2, {"a": null}]}');
SELECT idempotency.outbox_enqueue('s_stdout', '{"name": "odd key"}', E'tab\there "q"');
SELECT idempotency.outbox_enqueue('s_stdout', '{"name": "later", "expect": "pending"}', NULL, NULL, NULL,
                                  now() + interval '1 hour');
BEGIN;
SELECT idempotency.outbox_enqueue('s_stdout', '{"name": "rolled back", "rolled_back": true}');
ROLLBACK;
SQL
once stdout 60 --dsn "$dsn" --sink stdout --topics s_stdout
status=$?
check "stdout --once exits 0" test "$status" -eq 0
if $python "$here/check.py" stdout "$dir/stdout.out"; then ok "stdout sink: one JSON object per line with id, topic, key, headers, payload, attempt"
else not_ok "stdout sink: one JSON object per line with id, topic, key, headers, payload, attempt" "$(head -c 600 "$dir/stdout.out")"; fi
check "stdout: the three due events delivered, the delayed one still pending" \
    test "$(states s_stdout)" = "delivered=3 pending=1"
check "stdout: the delayed event was never handed out" \
    sql_is "SELECT attempts FROM idempotency.outbox WHERE payload->>'name' = 'later'" 0

# ---------------------------------------------------------------- scripted
log "scripted HTTP responses"
sql >/dev/null <<'SQL'
CREATE FUNCTION pg_temp.ev(name text, script text, expect text, key text DEFAULT NULL,
                           headers jsonb DEFAULT NULL, dedup text DEFAULT NULL) RETURNS bigint
LANGUAGE sql AS $$
  SELECT idempotency.outbox_enqueue('s_script',
           jsonb_build_object('name', name, 'script', script::jsonb, 'expect', expect), key, headers, dedup)
$$;
SELECT pg_temp.ev('ok200', '["200"]', 'delivered');
SELECT pg_temp.ev('ok204', '["204"]', 'delivered');
SELECT pg_temp.ev('conflict409', '["409"]', 'delivered');
SELECT pg_temp.ev('err500', '["500", "200"]', 'delivered');
SELECT pg_temp.ev('err503', '["503:0", "200"]', 'delivered');
SELECT pg_temp.ev('timeout408', '["408", "200"]', 'delivered');
SELECT pg_temp.ev('early425', '["425", "200"]', 'delivered');
SELECT pg_temp.ev('limited429', '["429:1", "200"]', 'delivered');
SELECT pg_temp.ev('bad400', '["400"]', 'dead');
SELECT pg_temp.ev('bad422', '["422", "200"]', 'dead');
SELECT pg_temp.ev('always500', '["500"]', 'dead');
SELECT pg_temp.ev('slow', '["sleep:2.5", "200"]', 'delivered');
SELECT pg_temp.ev('reset', '["reset", "200"]', 'delivered');
SELECT pg_temp.ev('headers', '["200"]', 'delivered', NULL,
                  '{"X-Custom": "hello", "Content-Type": "application/vnd.test+json", "X-Outbox-Id": "forged"}',
                  'dedup-1');
SELECT pg_temp.ev('chain1', '["500", "200"]', 'delivered', 'chain');
SELECT pg_temp.ev('chain2', '["200"]', 'delivered', 'chain');
BEGIN;
SELECT idempotency.outbox_enqueue('s_script', '{"name": "rolled back", "rolled_back": true}', 'chain');
ROLLBACK;
SQL
start_relay scripted --dsn "$dsn" --sink "$sink" --topics s_script --parallel 2 --lease 5s \
    --http-timeout 1s --poll-interval 200ms --progress-interval 0
scripted_pid=$relay_pid
if wait_until 60 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_script' AND state IN ('pending', 'in_flight')" 0; then
    ok "scripted: every event reached a final state"
else
    not_ok "scripted: every event reached a final state" "$(states s_script)"
    show_err scripted
fi
stop_relay "$scripted_pid" 20
check "scripted: SIGTERM exits 0" test $? -eq 0

expect_event() {  # expect_event NAME STATE ATTEMPTS [ERROR-LIKE]
    local row
    row=$(sql -F '|' -c "SELECT state, attempts, coalesce(last_error, '') FROM idempotency.outbox
                         WHERE topic = 's_script' AND payload->>'name' = '$1'")
    local state=${row%%|*} rest=${row#*|}
    local attempts=${rest%%|*} error=${rest#*|}
    if [ "$state" = "$2" ] && [ "$attempts" = "$3" ] &&
        { [ -z "${4:-}" ] || [[ "$error" == $4 ]]; }; then
        ok "scripted: $1 -> $2 after $3 attempt(s)${4:+ ($4)}"
    else
        not_ok "scripted: $1 -> $2 after $3 attempt(s)${4:+ ($4)}" "got: $row"
    fi
}
expect_event ok200 delivered 1
expect_event ok204 delivered 1
expect_event conflict409 delivered 1
expect_event err500 delivered 2 "HTTP 500*"
expect_event err503 delivered 2 "HTTP 503*"
expect_event timeout408 delivered 2 "HTTP 408*"
expect_event early425 delivered 2 "HTTP 425*"
expect_event limited429 delivered 2 "HTTP 429*"
expect_event bad400 dead 1 "HTTP 400*"
expect_event bad422 dead 1 "HTTP 422*"
expect_event always500 dead 3 "HTTP 500*"
expect_event slow delivered 2 "*imed out*"
expect_event reset delivered 2 "*"
expect_event headers delivered 1
expect_event chain1 delivered 2
expect_event chain2 delivered 1

scripted_checks=$($python - "$dir/receiver.jsonl" <<'PY'
import json, sys
entries = sorted((json.loads(l) for l in open(sys.argv[1]) if '"s_script"' in l), key=lambda e: e["t"])
out = []
# 429 with Retry-After: 1 -> the second attempt at least ~1 s after the first answer.
# (The names are in the payload, not the log: find events by their scripted actions.)
first = [e for e in entries if e["action"] == "429:1"]
if first:
    second = [e for e in entries if e["id"] == first[0]["id"] and e["attempt"] == 2]
    gap = second[0]["t"] - first[0]["t_end"] if second else -1
    out.append("retry_after_gap=%.2f" % gap)
hdr = [e for e in entries if e.get("ikey") == "dedup-1"]
if hdr:
    e = hdr[0]
    out.append("headers=%s|%s|%s" % (e["custom"], e["ctype"], "id-kept" if str(e["id"]) != "forged" else "forged"))
chain = [e for e in entries if e.get("key") == "chain"]
out.append("chain=" + ",".join("%s:%s" % (e["action"], e["status"]) for e in chain))
print(" ".join(out))
PY
)
gap=$(echo "$scripted_checks" | sed -nE 's/.*retry_after_gap=([-0-9.]+).*/\1/p')
check "scripted: 429 with Retry-After: 1 retried after about a second (gap ${gap:-none})" \
    $python -c "import sys; sys.exit(0 if float('${gap:--1}') >= 0.9 else 1)"
check "scripted: the event's headers and dedup_key reach the receiver; relay headers cannot be forged" \
    test "$(echo "$scripted_checks" | sed -nE 's/.*headers=([^ ]*).*/\1/p')" = "hello|application/vnd.test+json|id-kept"
check "scripted: a retried event holds back the next event of its key (500, 200, then the next)" \
    test "$(echo "$scripted_checks" | sed -nE 's/.*chain=([^ ]*).*/\1/p')" = "500:500,200:200,200:200"
check "scripted: Idempotency-Key is outbox-<id> without a dedup_key" \
    $python -c "
import json,sys
bad=[e for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_script' and e['ikey']!='dedup-1' and e['ikey']!='outbox-%d'%e['id']]
sys.exit(1 if bad else 0)"

# ---------------------------------------------------------------- refused
log "connection refused"
closed_port=$($python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sql -c "SELECT idempotency.outbox_enqueue('s_refused', jsonb_build_object('seq', g)) FROM generate_series(1, 5) g" >/dev/null
once refused1 60 --dsn "$dsn" --sink "http://127.0.0.1:$closed_port/events" --topics s_refused --http-timeout 2s
status=$?
check "refused: --once exits 0" test "$status" -eq 0
row=$(sql -c "SELECT count(*) FILTER (WHERE state = 'pending' AND attempts = 1 AND last_error ~* 'connect'), count(*)
              FROM idempotency.outbox WHERE topic = 's_refused'")
check "refused: every event retryable (pending, attempt 1, a connection error)" test "$row" = "5|5"
sleep 1.2  # idempotency.retry_max_delay is 1s here
once refused2 60 --dsn "$dsn" --sink "$sink" --topics s_refused
status=$?
check "refused: a later run delivers them (exit $status)" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_refused' AND state = 'delivered' AND attempts = 2" 5

# ---------------------------------------------------------------- order
log "per-key order with --parallel 4"
sql <<'SQL' >/dev/null
SELECT idempotency.outbox_enqueue('s_order',
         jsonb_build_object('seq', g, 'script',
           CASE WHEN g % 37 = 0 THEN '["500", "delay:0.005"]'::jsonb ELSE '["delay:0.005"]'::jsonb END),
         CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || (g * 7 % 9) END)
  FROM generate_series(1, 400) g;
SQL
start_relay order --dsn "$dsn" --sink "$sink" --topics s_order --parallel 4 --batch 50 \
    --poll-interval 200ms --progress-interval 0
order_pid=$relay_pid
if wait_until 90 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_order' AND state = 'delivered'" 400; then
    ok "order: 400 events delivered"
else
    not_ok "order: 400 events delivered" "$(states s_order)"; show_err order
fi
stop_relay "$order_pid" 20 INT
check "order: SIGINT exits 0" test $? -eq 0
check "order: per-key order at the receiver" $python "$here/check.py" order "$dir/receiver.jsonl" s_order
concurrency=$($python -c "
import json
print(max([e['concurrent'] for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_order'] or [0]))")
check "order: deliveries overlapped (at most $concurrency at once)" test "$concurrency" -ge 2

# ---------------------------------------------------------------- kill
log "SIGKILL mid-batch, then a restart"
sql <<'SQL' >/dev/null
SELECT idempotency.outbox_enqueue('s_kill', jsonb_build_object('seq', g, 'script', '["delay:0.05"]'::jsonb),
         CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || (g % 11) END)
  FROM generate_series(1, 300) g;
SQL
start_relay kill1 --dsn "$dsn" --sink "$sink" --topics s_kill --parallel 4 --batch 40 --lease 2s \
    --http-timeout 500ms --poll-interval 200ms --progress-interval 0
kill_pid=$relay_pid
wait_until 30 received_at_least s_kill 80
{ kill -KILL "$kill_pid"; wait "$kill_pid"; } 2>/dev/null
in_flight=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_kill' AND state = 'in_flight'")
delivered_before=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_kill' AND state = 'delivered'")
check "kill: killed mid-run ($delivered_before delivered, $in_flight in flight)" test "$delivered_before" -lt 300
start_relay kill2 --dsn "$dsn" --sink "$sink" --topics s_kill --parallel 4 --batch 40 --lease 2s \
    --http-timeout 500ms --poll-interval 200ms --progress-interval 0
kill2_pid=$relay_pid
if wait_until 90 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_kill' AND state = 'delivered'" 300; then
    ok "kill: the restarted relay delivers every event"
else
    not_ok "kill: the restarted relay delivers every event" "$(states s_kill)"; show_err kill2
fi
stop_relay "$kill2_pid" 20
check "kill: SIGTERM exits 0" test $? -eq 0
dump
check "kill: every event accepted by the receiver, none lost" $python "$here/check.py" complete "$dir/receiver.jsonl" "$dir/outbox.dump" s_kill
check "kill: duplicates only with the same Idempotency-Key" $python "$here/check.py" dups "$dir/receiver.jsonl" s_kill
check "kill: per-key order at the receiver" $python "$here/check.py" order "$dir/receiver.jsonl" s_kill

# ---------------------------------------------------------------- restart
log "PostgreSQL restart (immediate) under load"
start_relay restart --dsn "$dsn" --sink "$sink" --topics s_restart --parallel 2 --lease 3s \
    --http-timeout 1s --poll-interval 300ms --progress-interval 0
restart_pid=$relay_pid
: >"$dir/enqueuer.out"
(
    for i in $(seq 1 150); do
        payload="{\"seq\": $i, \"script\": [\"delay:0.002\"]}"
        key="k$((i % 5))"
        if [ $((i % 10)) -eq 0 ]; then
            payload="{\"seq\": $i, \"rolled_back\": true}"
            as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 \
                -c "BEGIN" -c "SELECT idempotency.outbox_enqueue('s_restart', '$payload', '$key')" \
                -c "ROLLBACK" >/dev/null 2>&1
            echo "$i rb" >>"$dir/enqueuer.out"
        elif as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 \
            -c "SELECT idempotency.outbox_enqueue('s_restart', '$payload', '$key')" >/dev/null 2>&1; then
            echo "$i ok" >>"$dir/enqueuer.out"
        else
            echo "$i fail" >>"$dir/enqueuer.out"
        fi
    done
    echo done >>"$dir/enqueuer.out"
) &
enqueuer_pid=$!
pids+=("$enqueuer_pid")
wait_until 60 grep -q '^40 ' "$dir/enqueuer.out"
as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m immediate -w restart >/dev/null 2>&1
check "restart: pg_ctl restart -m immediate" test $? -eq 0
wait_until 120 grep -q '^done' "$dir/enqueuer.out"
committed=$(grep -c ' ok$' "$dir/enqueuer.out")
wait_until 90 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_restart' AND state <> 'delivered'" 0
check "restart: the relay lived through it" kill -0 "$restart_pid"
if grep -q "reconnected to the database" "$dir/restart.err"; then ok "restart: the relay reconnected"
else not_ok "restart: the relay reconnected"; show_err restart; fi
stop_relay "$restart_pid" 20
check "restart: SIGTERM exits 0" test $? -eq 0
missing=$(grep ' ok$' "$dir/enqueuer.out" | cut -d' ' -f1 | while read -r seq; do
    [ "$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_restart' AND (payload->>'seq')::int = $seq")" = 1 ] ||
        echo "$seq"
done)
check "restart: every acknowledged enqueue ($committed) is in the outbox" test -z "$missing"
dump
check "restart: every committed event delivered, no rolled-back one" \
    $python "$here/check.py" complete "$dir/receiver.jsonl" "$dir/outbox.dump" s_restart
check "restart: per-key order at the receiver" $python "$here/check.py" order "$dir/receiver.jsonl" s_restart

# ---------------------------------------------------------------- drain
log "SIGTERM drains"
sql -c "SELECT idempotency.outbox_enqueue('s_drain', jsonb_build_object('seq', g, 'script', '[\"delay:0.3\"]'::jsonb), 'd' || g)
        FROM generate_series(1, 30) g" >/dev/null
start_relay drain --dsn "$dsn" --sink "$sink" --topics s_drain --parallel 2 --batch 6 --lease 20s \
    --http-timeout 5s --progress-interval 0
drain_pid=$relay_pid
wait_until 30 received_at_least s_drain 2
started=$SECONDS
stop_relay "$drain_pid" 15
status=$?
check "drain: SIGTERM exits 0 in $((SECONDS - started)) s" test "$status" -eq 0
check "drain: nothing left in flight" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_drain' AND state = 'in_flight'" 0
delivered=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_drain' AND state = 'delivered'")
check "drain: it stopped claiming ($delivered of 30 delivered, the rest never handed out)" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_drain' AND state = 'pending' AND attempts = 0" $((30 - delivered))
accepted=$($python -c "
import json
print(len({e['id'] for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_drain' and e['status']==200}))")
check "drain: every delivery the receiver accepted was acked ($accepted)" test "$accepted" = "$delivered"
check "drain: it said so on stderr" grep -q "stopping" "$dir/drain.err"

# ---------------------------------------------------------------- once
log "--once"
sql <<'SQL' >/dev/null
SELECT idempotency.outbox_enqueue('s_once', jsonb_build_object('seq', g), 'o' || (g % 5)) FROM generate_series(1, 50) g;
SELECT idempotency.outbox_enqueue('s_once', '{"seq": 51, "expect": "pending"}', NULL, NULL, NULL, now() + interval '1 hour');
SQL
started=$SECONDS
once once 60 --dsn "$dsn" --sink "$sink" --topics s_once --parallel 3
status=$?
check "once: exits 0 after $((SECONDS - started)) s" test "$status" -eq 0
check "once: the 50 due events delivered, the delayed one not handed out" \
    test "$(states s_once)" = "delivered=50 pending=1"
check "once: the receiver got each due event once" test "$(received s_once)" = 50

# ---------------------------------------------------------------- notify, progress, metrics
log "LISTEN wake-up, progress and metrics"
start_relay notify --dsn "host=$dir port=$port dbname=$db user=relay_monitor" --sink "$sink" \
    --topics s_notify --poll-interval 60s --progress-interval 1s --metrics-addr 127.0.0.1:0
notify_pid=$relay_pid
wait_until 15 grep -q "metrics on http://127.0.0.1:" "$dir/notify.err"
metrics_port=$(sed -nE 's|.*metrics on http://127.0.0.1:([0-9]+)/metrics.*|\1|p' "$dir/notify.err" | head -n 1)
sleep 1.5  # the first claims are done; only a notification can wake it now
sent=$($python -c 'import time; print(time.time())')
sql -c "SELECT idempotency.outbox_enqueue('s_notify', '{\"seq\": 1}', 'n1')" >/dev/null
if wait_until 10 received_at_least s_notify 1; then
    latency=$($python -c "
import json
print('%.3f' % min(e['t'] for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_notify') )")
    delay=$($python -c "print('%.3f' % ($latency - $sent))")
    check "notify: woken by LISTEN, delivered ${delay}s after the commit (poll interval 60s)" \
        $python -c "import sys; sys.exit(0 if $delay < 2 else 1)"
else
    not_ok "notify: woken by LISTEN (poll interval 60s)"
fi
wait_until 10 sql_is "SELECT state FROM idempotency.outbox WHERE topic = 's_notify'" delivered
sleep 1.2
metrics=$($python -c "
import urllib.request
print(urllib.request.urlopen('http://127.0.0.1:${metrics_port:-1}/metrics', timeout=5).read().decode())" 2>&1)
check "metrics: Prometheus text with the delivered count" \
    grep -q '^idem_relay_delivered_total{relay="notify"} 1$' <<<"$metrics"
check "metrics: in flight, connection, outbox lag and delivery histograms" \
    bash -c 'for m in idem_relay_in_flight idem_relay_db_connected idem_relay_outbox_lag_seconds \
        idem_relay_delivery_seconds_bucket idem_relay_delivery_delay_seconds_count; do
        grep -q "^$m{" <<<"$1" || exit 1; done' _ "$metrics"
health=$($python -c "
import urllib.request
print(urllib.request.urlopen('http://127.0.0.1:${metrics_port:-1}/healthz', timeout=5).read().decode().strip())" 2>&1)
check "metrics: /healthz says ok" test "$health" = ok
check "progress: a periodic line on stderr with delivered, retried, dead and lag" \
    grep -qE 'delivered=1 retried=0 dead=0 in_flight=0 lag=[0-9.]+s' "$dir/notify.err"
# A burst of small transactions over three keys: every one must arrive by
# LISTEN alone, including those whose notification came in while the relay
# was busy with a claim or an ack (a missed wake-up would wait for the poll).
for i in $(seq 2 41); do
    echo "SELECT idempotency.outbox_enqueue('s_notify', '{\"seq\": $i}', 'n$((i % 3))');"
    echo "SELECT pg_sleep(0.003);"
done | sql >/dev/null
if wait_until 10 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_notify' AND state = 'delivered'" 41; then
    ok "notify: a burst of 40 commits all delivered by LISTEN alone"
else
    not_ok "notify: a burst of 40 commits all delivered by LISTEN alone" "$(states s_notify)"
fi
stop_relay "$notify_pid" 20
check "notify: SIGTERM exits 0" test $? -eq 0

# ---------------------------------------------------------------- final
log "final count"
once final 60 --dsn "$dsn" --sink "$sink" --topics s_script,s_refused,s_order,s_kill,s_restart,s_drain,s_once,s_notify
check "final: a last --once run exits 0" test $? -eq 0
sql -c "DELETE FROM idempotency.outbox WHERE topic = 's_stdout' OR payload->>'expect' = 'pending'"
dump
check "final: every committed event delivered (or dead as scripted), never a rolled-back one" \
    $python "$here/check.py" complete "$dir/receiver.jsonl" "$dir/outbox.dump"
check "final: per-key order kept at the receiver" $python "$here/check.py" order "$dir/receiver.jsonl"
check "final: duplicates only with the same Idempotency-Key" $python "$here/check.py" dups "$dir/receiver.jsonl"
check "final: nothing left in flight" sql_is "SELECT count(*) FROM idempotency.outbox WHERE state = 'in_flight'" 0

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
