#!/usr/bin/env bash
# idem-relay end to end: a throwaway cluster, a scripted HTTP receiver on
# 127.0.0.1 (receiver.py) and the installed idem-relay, scenario by scenario:
#
#   cli        --help documents every option; bad options (no --topics nor
#              --all-topics among them) exit 2 with a message, a sink's
#              password unprinted; --version is the project's version; an
#              unreachable database or a database without the extension exit
#              1 with a message
#   stdout     the stdout sink's JSON lines; --once; a delayed event and a
#              rolled-back one are not delivered; without --dsn the PG*
#              variables apply
#   scripted   200, 204 and a 200 whose body never ends ack; 409 (+
#              Retry-After), 500, 408, 425, 503, 429 + Retry-After, a reset
#              connection and a response slower than --http-timeout are
#              retried; 400 and 422 are dead at once; a steady 500 is dead
#              after idempotency.outbox_max_attempts; the event's headers and
#              dedup_key reach the receiver, reserved names ('_' folded) and
#              control bytes do not; keys encoded reversibly; a key with CR/LF
#              forges no log line; a retried event holds back the next event
#              of its key
#   refused    connection refused: retried, delivered by a later run; the
#              URL's password and query values are not logged
#   misconfigured  a 404 on every delivery stops the relay (exit 1) with the
#              events pending, attempts not counted
#   Retry-After  0, a past date and a far-future value: raised to the
#              backoff, capped at its maximum
#   once       exit 3 after dead letters, the summary counts retries; a slow
#              receiver: skipped events released and delivered in the run
#   pipe       stdout | head -1: only the line read is delivered, exit 1
#   topics     --topics "a, b" takes both
#   noack      an ack refused: /healthz 503, exit 1, nothing sent again
#   bound      SIGTERM with a slow receiver: within --http-timeout, nothing
#              started after it, the rest released
#   memory     --max-in-flight-bytes bounds the relay's memory
#   order      --parallel 4: deliveries overlap, per-key order holds (every
#              arrival; runs of a key go out one event after the other)
#   connections  --connections 2: two connections share the work, per-key
#              order holds, one SIGTERM drains both, one last line; a lane
#              whose ack is refused stops every lane (exit 1)
#   kill       SIGKILL mid-batch, restart: every event delivered, duplicates
#              only with the same Idempotency-Key, first arrivals in per-key
#              order (the restarted relay delivers the unacked runs again)
#   restart    pg_ctl restart -m immediate under a running relay and a running
#              enqueuer: nothing committed is lost, nothing rolled back arrives
#   drain      SIGTERM: exit 0 within bounds, nothing left in flight
#   hangup     SIGHUP: the same graceful stop (exit 0, nothing in flight)
#   tls        an HTTPS receiver with a private CA that wants a client
#              certificate: untrusted, the relay stops (exit 1, nothing
#              charged); with --ca-file, --client-cert, --client-key delivered
#   secrets    IDEM_RELAY_SINK / IDEM_RELAY_DSN from the environment and
#              --sink-file: nothing secret in /proc/PID/cmdline; a token as
#              the bare user name, passwords and ?token= values not logged
#   once       --once delivers what is due and exits
#   notify     wakes on LISTEN (poll interval 60 s), progress lines on stderr,
#              Prometheus metrics and /healthz on --metrics-addr 0.0.0.0:0,
#              delays right under extra_float_digits = -15;
#              slow clients (a byte every 1.5 s) delay no /healthz probe
#   final      over the whole run: every committed event delivered (or dead as
#              scripted), never a rolled-back one, per-key order of first
#              arrivals, duplicates only with the same Idempotency-Key
#
# Run as root after the extension and idem-relay are installed (make install);
# it builds and installs nothing. Prints one "ok N - ..." or "not ok N - ..."
# line per check and ends with "N passed, N failed"; exits non-zero on any
# failure. Settings: RELAY_TEST_PORT (54440), IDEM_RELAY (the binary; default
# $(pg_config --bindir)/idem-relay).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"
. "$here/harness.sh"

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

received() { grep -c "\"topic\":\"$1\"" "$dir/receiver.jsonl" 2>/dev/null || true; }
received_at_least() { [ "$(received "$1")" -ge "$2" ]; }
live() { sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = '$1' AND state IN ('pending', 'in_flight')"; }
dump() {
    sql -F '|' -c "SELECT id, topic, translate(coalesce(key, ''), E'\n|', '  '), state, attempts,
                          coalesce(payload->>'expect', ''), translate(coalesce(dedup_key, ''), E'\n|', '  '),
                          translate(coalesce(last_error, ''), E'\n|', '  ')
                     FROM idempotency.outbox ORDER BY id" >"$dir/outbox.dump"
}
# DSN of the application-like role (USAGE on schema idempotency only).
dsn="host=$dir port=$port dbname=$db user=relay_app"


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
# The roles, in one place: relay_app and relay_monitor (with pg_monitor) may
# do what a relay does; relay_noack may do all of it but outbox_ack.
sql <<'SQL' || { echo "relay tests: setup failed" >&2; echo "0 passed, 1 failed"; exit 1; }
CREATE EXTENSION idempotency;
CREATE ROLE relay_app LOGIN;
CREATE ROLE relay_monitor LOGIN IN ROLE pg_monitor;
CREATE ROLE relay_noack LOGIN;
SELECT idempotency.grant_relay(r) FROM unnest(ARRAY['relay_app', 'relay_monitor', 'relay_noack']::regrole[]) r;
-- A relay whose acks are refused: the relay must stop and say so.
REVOKE EXECUTE ON FUNCTION idempotency.outbox_ack(bigint[]) FROM relay_noack;
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
for option in --dsn --relay --sink --topics --all-topics --batch --lease --parallel --connections --once \
    --metrics-addr --poll-interval --http-timeout --connect-timeout --progress-interval \
    --max-in-flight-bytes --maintenance-interval; do
    grep -q -- "$option" "$dir/help.out" || missing="$missing $option"
done
if [ "$status" -eq 0 ] && [ -z "$missing" ]; then ok "--help exits 0 and documents every option"
else not_ok "--help exits 0 and documents every option" "status $status, missing:$missing"; fi

bad_option() {  # bad_option EXPECTED-MESSAGE ARGS...
    local expected=$1; shift
    timeout -s KILL 10 "$relay_bin" "$@" >"$dir/bad.out" 2>"$dir/bad.err" </dev/null
    local status=$?
    if [ "$status" -eq 2 ] && grep -qi -- "$expected" "$dir/bad.err"; then
        ok "bad command line exits 2: $*"
    else
        not_ok "bad command line exits 2: $*" "status $status: $(head -c 300 "$dir/bad.err")"
    fi
}
bad_option "--relay is required"
bad_option "unknown option" --dsn "$dsn" --relay r --sink stdout --bogus
bad_option "--sink is required" --dsn "$dsn" --relay r
bad_option "--batch must be" --dsn "$dsn" --relay r --sink stdout --batch 0
bad_option "--batch must be" --dsn "$dsn" --relay r --sink stdout --batch 10001
bad_option "--parallel must be" --dsn "$dsn" --relay r --sink stdout --parallel many
bad_option "--connections must be" --dsn "$dsn" --relay r --sink stdout --connections 0
bad_option "--connections must be" --dsn "$dsn" --relay r --sink stdout --connections 17
bad_option "--lease must be" --dsn "$dsn" --relay r --sink stdout --lease 30x
bad_option "--sink must be" --dsn "$dsn" --relay r --sink ftp://example
bad_option "not a valid URL" --dsn "$dsn" --relay r --sink "http://" --all-topics
bad_option "cannot resolve" --dsn "$dsn" --relay r --sink stdout --all-topics --metrics-addr no-such-host.invalid:9187
bad_option "nats://host" --dsn "$dsn" --relay r --sink "nats://" --all-topics
bad_option "no host" --dsn "$dsn" --relay r --sink "amqp://u:s3cret@/v" --all-topics
bad_option "shorter than --lease" --dsn "$dsn" --relay r --sink stdout --all-topics --lease 2s --http-timeout 5s
bad_option "needs a value" --dsn "$dsn" --relay r --sink stdout --topics
bad_option "--topics or --all-topics is required" --dsn "$dsn" --relay r --sink stdout
bad_option "--topics or --all-topics is required" --dsn "$dsn" --relay r --sink "http://127.0.0.1:1/events"
bad_option "exclude each other" --dsn "$dsn" --relay r --sink stdout --topics a --all-topics
bad_option "--max-in-flight-bytes must be" --dsn "$dsn" --relay r --sink stdout --all-topics --max-in-flight-bytes 10
bad_option "--maintenance-interval must be" --dsn "$dsn" --relay r --sink stdout --all-topics --maintenance-interval 0
# A sink URL's password and query values never reach the log.
timeout -s KILL 10 "$relay_bin" --dsn "$dsn" --relay r --sink "http://user:s3cret@" --all-topics >"$dir/bad.out" 2>"$dir/bad.err"
status=$?
if [ "$status" -eq 2 ] && grep -q "\*\*\*:\*\*\*@" "$dir/bad.err" && ! grep -qE "s3cret|user" "$dir/bad.err"; then
    ok "a sink URL that does not parse: its password is not printed"
else
    not_ok "a sink URL that does not parse: its password is not printed" "status $status: $(head -c 300 "$dir/bad.err")"
fi

# --version is the project's single version, the extension's default_version.
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$here/../../idempotency.control")
check "--version says idem-relay $version" test "$("$relay_bin" --version)" = "idem-relay $version"

timeout -s KILL 30 "$relay_bin" --dsn "host=$dir/nowhere port=1 dbname=x connect_timeout=3" \
    --relay r --sink stdout --all-topics --once >"$dir/unreachable.out" 2>"$dir/unreachable.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "cannot connect to the database" "$dir/unreachable.err"; then
    ok "an unreachable database: a clear message and exit 1"
else
    not_ok "an unreachable database: a clear message and exit 1" "status $status: $(head -c 300 "$dir/unreachable.err")"
fi
timeout -s KILL 30 "$relay_bin" --dsn "host=$dir port=$port dbname=postgres user=postgres" \
    --relay r --sink stdout --all-topics --once >"$dir/noext.out" 2>"$dir/noext.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "extension is not installed" "$dir/noext.err"; then
    ok "a database without the extension: a clear message and exit 1"
else
    not_ok "a database without the extension: a clear message and exit 1" "status $status: $(head -c 300 "$dir/noext.err")"
fi

sql -c "CREATE ROLE relay_nobody LOGIN" >/dev/null
timeout -s KILL 30 "$relay_bin" --dsn "host=$dir port=$port dbname=$db user=relay_nobody" \
    --relay r --sink stdout --all-topics --once >"$dir/nousage.out" 2>"$dir/nousage.err"
status=$?
if [ "$status" -eq 1 ] && grep -q "may not use schema idempotency" "$dir/nousage.err"; then
    ok "a role without USAGE on schema idempotency: a clear message and exit 1"
else
    not_ok "a role without USAGE on schema idempotency: a clear message and exit 1" "status $status: $(head -c 300 "$dir/nousage.err")"
fi
timeout -s KILL 30 "$relay_bin" --dsn "$dsn" --relay r --sink stdout --all-topics --once --lease 48h \
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

# Without --dsn, libpq's PG* variables say where the database is.
sql -c "SELECT idempotency.outbox_enqueue('s_pgenv', '{\"n\": 1}')" >/dev/null
PGHOST=$dir PGPORT=$port PGDATABASE=$db PGUSER=relay_app once pgenv 60 --sink stdout --topics s_pgenv
status=$?
check "no --dsn: PGHOST, PGPORT, PGDATABASE and PGUSER apply (exit $status, $(states s_pgenv))" \
    test "$status" -eq 0 -a "$(states s_pgenv)" = "delivered=1"

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
SELECT pg_temp.ev('conflict409', '["409", "200"]', 'delivered');
SELECT pg_temp.ev('conflict409ra', '["409:1", "200"]', 'delivered');
SELECT pg_temp.ev('hang200', '["hang200:3"]', 'delivered');
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
SELECT pg_temp.ev('forged', '["200"]', 'delivered', NULL,
                  '{"Idempotency_Key": "forged", "X_Outbox_Id": "forged", "x_outbox_attempt": "9",
                    "X-Ctl": "a\u0001b"}', 'dedup-2');
SELECT pg_temp.ev('enc1', '["200"]', 'delivered', NULL, NULL, E'same\nkey');
SELECT pg_temp.ev('enc2', '["200"]', 'delivered', NULL, NULL, 'same%0Akey');
SELECT pg_temp.ev('enc3', '["200"]', 'delivered', NULL, NULL, 'same key ');
SELECT pg_temp.ev('evilkey', '["400"]', 'dead', E'evil\n2000-01-01 00:00:00.000 idem-relay[scripted]: FORGED');
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
expect_event conflict409 delivered 2 "HTTP 409*"
expect_event conflict409ra delivered 2 "HTTP 409*"
expect_event hang200 delivered 1
expect_event forged delivered 1
expect_event evilkey dead 1 "HTTP 400*"
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
for action, name in (("429:1", "retry_after_gap"), ("409:1", "conflict_gap")):
    first = [e for e in entries if e["action"] == action]
    if first:
        second = [e for e in entries if e["id"] == first[0]["id"] and e["attempt"] == 2]
        gap = second[0]["t"] - first[0]["t_end"] if second else -1
        out.append("%s=%.2f" % (name, gap))
# Header names as a WSGI server sees them ('_' folded into '-', case ignored).
relay_names = {"idempotency-key", "x-outbox-id", "x-outbox-topic", "x-outbox-key", "x-outbox-attempt"}
forged = [e for e in entries if "dedup-2" in e.get("ikeys", [])]
if forged:
    folded = [n.lower().replace("_", "-") for n in forged[0]["names"]]
    clean = all(folded.count(n) <= 1 for n in relay_names) and forged[0]["ikeys"] == ["dedup-2"]
    out.append("forged=%s|%s" % ("clean" if clean else "forged:" + ",".join(forged[0]["names"]),
                                 "no-ctl" if forged[0]["ctl"] is None else "ctl-sent"))
hdr = [e for e in entries if e.get("ikey") == "dedup-1"]
if hdr:
    e = hdr[0]
    out.append("headers=%s|%s|%s|%s" % (e["custom"], e["ctype"], "id-kept" if str(e["id"]) != "forged" else "forged",
                                        e["agent"]))
chain = [e for e in entries if e.get("key") == "chain"]
out.append("chain=" + ",".join("%s:%s" % (e["action"], e["status"]) for e in chain))
print(" ".join(out))
PY
)
gap=$(echo "$scripted_checks" | sed -nE 's/.*retry_after_gap=([-0-9.]+).*/\1/p')
check "scripted: 429 with Retry-After: 1 retried after about a second (gap ${gap:-none})" \
    $python -c "import sys; sys.exit(0 if float('${gap:--1}') >= 0.9 else 1)"
check "scripted: the event's headers and dedup_key reach the receiver; relay headers cannot be forged; the relay names its version" \
    test "$(echo "$scripted_checks" | sed -nE 's/.*headers=([^ ]*).*/\1/p')" = "hello|application/vnd.test+json|id-kept|idem-relay/$version"
gap=$(echo "$scripted_checks" | sed -nE 's/.*conflict_gap=([-0-9.]+).*/\1/p')
check "scripted: 409 is retried, with Retry-After: 1 after about a second (gap ${gap:-none})" \
    $python -c "import sys; sys.exit(0 if float('${gap:--1}') >= 0.9 else 1)"
check "scripted: event headers named Idempotency_Key, X_Outbox_Id or x_outbox_attempt are not sent; nor a control byte" \
    test "$(echo "$scripted_checks" | sed -nE 's/.*forged=([^ ]*).*/\1/p')" = "clean|no-ctl"
check "scripted: a key with CR/LF forges no line in the relay's log" \
    bash -c '! grep -q "^2000-01-01" "$1" && grep -q "evil\\\\n2000" "$1"' _ "$dir/scripted.err"
check "scripted: Idempotency-Key is encoded reversibly (%, space and control bytes as %XX)" \
    $python -c "
import json, sys, urllib.parse
want = {'same\nkey', 'same%0Akey', 'same key '}
got = [e['ikey'] for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic'] == 's_script' and e['ikey'] and e['ikey'].startswith('same')]
sys.exit(0 if len(set(got)) == 3 and {urllib.parse.unquote(k) for k in got} == want and all(' ' not in k for k in got) else 1)"
check "scripted: a retried event holds back the next event of its key (500, 200, then the next)" \
    test "$(echo "$scripted_checks" | sed -nE 's/.*chain=([^ ]*).*/\1/p')" = "500:500,200:200,200:200"
check "scripted: Idempotency-Key is outbox-<id> without a dedup_key" \
    $python -c "
import json,sys
dedups={'dedup-1', 'dedup-2', 'same%0Akey', 'same%250Akey', 'same%20key%20'}
bad=[e for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_script' and e['ikey'] not in dedups and e['ikey']!='outbox-%d'%e['id']]
sys.exit(1 if bad else 0)"

# ---------------------------------------------------------------- refused
# ---------------------------------------------------------------- a dead head
# A dead event holds its key's later events back: a --once run delivers
# neither the dead head (it is dead) nor the event behind it; the relay's
# role may redrive (the head is delivered again first) or discard it (the
# next event goes out).
log "a dead head"
# (Events that succeed come first: a sink whose first deliveries all fail
# alike would stop the relay as misconfigured.)
sql >/dev/null <<'SQL'
SELECT idempotency.outbox_enqueue('s_dead', jsonb_build_object('name', 'fine' || n, 'script', '["200"]'::jsonb))
  FROM generate_series(1, 2) n;
SELECT idempotency.outbox_enqueue('s_dead', '{"name": "poison", "script": ["400"]}', 'blocked');
SELECT idempotency.outbox_enqueue('s_dead', '{"name": "behind", "script": ["200"]}', 'blocked');
SQL
dead_run() { once "$1" 30 --dsn "$dsn" --sink "$sink" --topics s_dead --lease 5s; }
dead_run dead1
check "dead head: the poison head went dead" \
    sql_is "SELECT state FROM idempotency.outbox WHERE payload->>'name' = 'poison'" dead
behind=$(sql -c "SELECT id || ' ' || attempts || ' ' || state FROM idempotency.outbox WHERE payload->>'name' = 'behind'")
check "dead head: the event behind it was never handed out, and never sent ($behind)" \
    $python -c "
import json, sys
id, attempts, state = '$behind'.split()
sent = [e for e in map(json.loads, open('$dir/receiver.jsonl')) if str(e['id']) == id]
sys.exit(0 if attempts == '0' and state == 'pending' and not sent else 1)"
relay_sql() { as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U relay_app -d "$db" -v ON_ERROR_STOP=1 -c "$1"; }
sql -c "SELECT idempotency.outbox_enqueue('s_dead', '{\"name\": \"fine3\", \"script\": [\"200\"]}')" >/dev/null
check "dead head: the relay's role redrives its topic's dead letter" \
    test "$(relay_sql "SELECT idempotency.outbox_redrive(topic => 's_dead')")" = 1
dead_run dead2
check "dead head: redriven, the head was sent again first and went dead again; the event behind still waits" \
    test "$(states s_dead)" = "dead=1 delivered=3 pending=1"
# The operator finds the dead letter's id as the owner (the relay's role does
# not read the dead letters' payloads); the relay's role discards it.
dead_ids=$(sql -c "SELECT string_agg(id::text, ',') FROM idempotency.outbox_dead_letters WHERE topic = 's_dead'")
check "dead head: the relay's role discards the dead letter ($dead_ids)" \
    test "$(relay_sql "SELECT idempotency.outbox_discard('{$dead_ids}')" 2>&1)" = 1
dead_run dead3
check "dead head: discarded, the event behind it is delivered" \
    test "$(states s_dead)" = "delivered=4"

log "connection refused"
closed_port=$($python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sql -c "SELECT idempotency.outbox_enqueue('s_refused', jsonb_build_object('seq', g)) FROM generate_series(1, 5) g" >/dev/null
once refused1 60 --dsn "$dsn" --sink "http://user:s3cret@127.0.0.1:$closed_port/events?token=t0ken&x=1" \
    --topics s_refused --http-timeout 2s
status=$?
check "refused: --once exits 0, its summary counts the events waiting for a retry" \
    bash -c '[ "$1" -eq 0 ] && grep -q "waiting_retry=5 " "$2"' _ "$status" "$dir/refused1.err"
check "refused: the sink's password and query values are not in the log" \
    bash -c '! grep -qE "s3cret|t0ken" "$1" && grep -q "\*\*\*:\*\*\*@127.0.0.1:[0-9]*/events?token=\*\*\*&x=\*\*\*" "$1"' _ "$dir/refused1.err"
row=$(sql -c "SELECT count(*) FILTER (WHERE state = 'pending' AND attempts = 1 AND last_error ~* 'connect'), count(*)
              FROM idempotency.outbox WHERE topic = 's_refused'")
check "refused: every event retryable (pending, attempt 1, a connection error)" test "$row" = "5|5"
sleep 1.2  # idempotency.retry_max_delay is 1s here
once refused2 60 --dsn "$dsn" --sink "$sink" --topics s_refused
status=$?
check "refused: a later run delivers them (exit $status)" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_refused' AND state = 'delivered' AND attempts = 2" 5

# ---------------------------------------------------------------- misconfigured
log "a misconfigured sink (404 on every delivery)"
sql -c "SELECT idempotency.outbox_enqueue('s_misconf', jsonb_build_object('seq', g), 'm' || g)
        FROM generate_series(1, 60) g" >/dev/null
once misconf 60 --dsn "$dsn" --sink "${sink%/events}/evnets" --topics s_misconf --parallel 2
status=$?
check "misconfigured: --once stops with exit 1 (exit $status)" test "$status" -eq 1
check "misconfigured: it says why" grep -q "answered HTTP 404.* to each of the first 10 events delivered" "$dir/misconf.err"
check "misconfigured: no event is dead; every one pending, its attempts not counted ($(states s_misconf))" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_misconf' AND state = 'pending' AND attempts = 0" 60
requests=$(grep -c '"topic":"s_misconf"' "$dir/receiver.jsonl")
check "misconfigured: it stopped after the first deliveries ($requests requests for 60 events)" \
    test "$requests" -le 10
# Two keys: only their heads can be tried, and they decide.
sql -c "SELECT idempotency.outbox_enqueue('s_misconf2', jsonb_build_object('seq', g), 'mk' || (g % 2))
        FROM generate_series(1, 4) g" >/dev/null
once misconf2 60 --dsn "$dsn" --sink "${sink%/events}/evnets" --topics s_misconf2 --poll-interval 200ms
status=$?
check "misconfigured: with two keys, their two heads decide: exit $status, $(states s_misconf2)" \
    bash -c '[ "$1" -eq 1 ] && grep -q "to each of the first 2 events delivered" "$2" && [ "$3" = "pending=4" ]' \
    _ "$status" "$dir/misconf2.err" "$(states s_misconf2)"
# A relay that runs on, with fewer events than the check wants: refused
# again after their release (half their lease), they decide. Each event is
# sent twice, three times on a machine so slow that a delivery outlasts
# the half lease; the earlier relay sent them until it was killed.
sql -c "SELECT idempotency.outbox_enqueue('s_misconf3', jsonb_build_object('seq', g), 'mr' || g)
        FROM generate_series(1, 3) g" >/dev/null
timeout -s KILL 60 "$relay_bin" --relay misconf3 --dsn "$dsn" --sink "${sink%/events}/evnets" \
    --topics s_misconf3 --lease 2s --http-timeout 1s --poll-interval 200ms >"$dir/misconf3.out" 2>"$dir/misconf3.err"
status=$?
requests=$(grep -c '"topic":"s_misconf3"' "$dir/receiver.jsonl")
check "misconfigured: a running relay with 3 events stops once one is refused again: exit $status, $requests requests, $(states s_misconf3)" \
    bash -c '[ "$1" -eq 1 ] && grep -q "to each of the first 3 events delivered" "$2" && [ "$3" -le 9 ] &&
             [ "$4" = 3 ]' _ "$status" "$dir/misconf3.err" "$requests" \
    "$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_misconf3' AND state = 'pending' AND attempts = 0")"
once misconf_fixed 60 --dsn "$dsn" --sink "$sink" --topics s_misconf,s_misconf3 --parallel 2
check "misconfigured: with the URL fixed, every event is delivered at its first attempt (exit $?)" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic IN ('s_misconf', 's_misconf3') AND state = 'delivered' AND attempts = 1" 63

# ---------------------------------------------------------------- Retry-After bounds
log "Retry-After: raised to the backoff, capped at its maximum"
sql >/dev/null <<'SQL'
SELECT idempotency.outbox_enqueue('s_after', jsonb_build_object('name', n, 'script', s::jsonb))
  FROM (VALUES ('zero', '["429:0", "200"]'),
               ('past', '["503:Thu, 01 Jan 1970 00:00:00 GMT", "200"]'),
               ('far', '["503:99999999999", "200"]')) v(n, s);
SQL
# This relay's session: the backoff starts at 2 s and stops at 3 s.
after_dsn="$dsn options='-c idempotency.retry_base_delay=2s -c idempotency.retry_max_delay=3s'"
start_relay after --dsn "$after_dsn" --sink "$sink" --topics s_after --parallel 3 --lease 10s \
    --poll-interval 100ms --progress-interval 0
after_pid=$relay_pid
wait_until 30 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_after' AND state = 'delivered'" 3
stop_relay "$after_pid" 20
after=$($python - "$dir/receiver.jsonl" <<'PY'
import json, sys
entries = [json.loads(l) for l in open(sys.argv[1]) if '"s_after"' in l]
out = []
for action in ("429:0", "503:Thu, 01 Jan 1970 00:00:00 GMT", "503:99999999999"):
    first = [e for e in entries if e["action"] == action]
    second = [e for e in entries if first and e["id"] == first[0]["id"] and e["attempt"] == 2]
    out.append("%.2f" % (second[0]["t"] - first[0]["t_end"]) if second else "none")
print(" ".join(out))
PY
)
read -r gap_zero gap_past gap_far <<<"$after"
check "Retry-After: 0 waits the backoff of the attempt, 2 s (waited ${gap_zero})" \
    $python -c "import sys; sys.exit(0 if float('${gap_zero/none/-1}') >= 1.9 else 1)"
check "Retry-After: a date in the past waits the backoff, 2 s (waited ${gap_past})" \
    $python -c "import sys; sys.exit(0 if float('${gap_past/none/-1}') >= 1.9 else 1)"
check "Retry-After: 99999999999 s waits the backoff's maximum, 3 s (waited ${gap_far})" \
    $python -c "import sys; sys.exit(0 if 2.9 <= float('${gap_far/none/-1}') < 6 else 1)"
check "Retry-After: each failure was recorded by its nack" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_after' AND attempts = 2 AND last_error ~ '^HTTP (429|503)'" 3

# ---------------------------------------------------------------- --once outcomes
log "--once: dead letters and retries in its exit status and summary"
sql >/dev/null <<'SQL'
SELECT idempotency.outbox_enqueue('s_once_dead', jsonb_build_object('seq', g, 'script', s::jsonb,
                                  'expect', e), 'od' || g)
  FROM (VALUES (1, '["200"]', 'delivered'), (2, '["400"]', 'dead'),
               (3, '["500", "200"]', 'delivered')) v(g, s, e);
SQL
# A backoff of 5 s: the retried event is not due again within the run.
once once_dead 60 --dsn "$dsn options='-c idempotency.retry_base_delay=5s'" --sink "$sink" --topics s_once_dead
status=$?
check "once: exit 3 when events went dead in the run (exit $status)" test "$status" -eq 3
check "once: its summary counts the dead and the events waiting for a retry" \
    grep -qE 'stopped: delivered=1 retried=1 dead=1 .* waiting_retry=1 ' "$dir/once_dead.err"

log "--once with a slow receiver: events past their lease are released, not charged an attempt"
sql -c "SELECT idempotency.outbox_enqueue('s_slow', jsonb_build_object('seq', g, 'script', '[\"delay:0.3\"]'::jsonb), 'sl' || g)
        FROM generate_series(1, 12) g" >/dev/null
once slow 60 --dsn "$dsn" --sink "$sink" --topics s_slow --lease 2s --http-timeout 1s --batch 50
status=$?
check "slow: --once delivers everything due and exits 0 (exit $status, $(states s_slow))" \
    test "$status" -eq 0 -a "$(states s_slow)" = "delivered=12"
check "slow: every event delivered at its first attempt" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_slow' AND state = 'delivered' AND attempts = 1" 12
check "slow: some events were released unattempted, and the summary says so" \
    grep -qE 'stopped: .* dead=0 .* released=[1-9][0-9]* not_attempted=0' "$dir/slow.err"

# ---------------------------------------------------------------- stdout to a pipe
log "stdout into a pipe that closes (| head -1)"
sql -c "SELECT idempotency.outbox_enqueue('s_pipe', jsonb_build_object('seq', g)) FROM generate_series(1, 10) g" >/dev/null
timeout -s KILL 60 "$relay_bin" --relay pipe --once --dsn "$dsn" --sink stdout --topics s_pipe \
    2>"$dir/pipe.err" | head -n 1 >"$dir/pipe.out"
status=${PIPESTATUS[0]}
check "pipe: the relay stops with exit 1 when the pipe closes (exit $status)" test "$status" -eq 1
shown=$($python -c "import json; print(json.loads(open('$dir/pipe.out').readline())['id'])" 2>/dev/null)
check "pipe: only the line head read is delivered ($(states s_pipe))" \
    sql_is "SELECT string_agg(id::text, ',') FROM idempotency.outbox WHERE topic = 's_pipe' AND state = 'delivered'" "${shown:-none}"

# ---------------------------------------------------------------- --topics "a, b"
log "--topics with spaces after the commas"
sql -c "SELECT idempotency.outbox_enqueue(t, '{}') FROM unnest(ARRAY['s_trim_a', 's_trim_b']) t" >/dev/null
once trim 60 --dsn "$dsn" --sink stdout --topics "s_trim_a, s_trim_b"
check "topics: 's_trim_a, s_trim_b' delivers both topics (exit $?)" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic IN ('s_trim_a', 's_trim_b') AND state = 'delivered'" 2

# ---------------------------------------------------------------- a limit on threads
log "a limit on threads (ulimit -u): a clear error, exit 1, nothing claimed"
sql -c "SELECT idempotency.outbox_enqueue('s_threads', '{}') FROM generate_series(1, 3)" >/dev/null
# The OS user's processes (the clusters') are past a limit of 1, so the
# relay cannot start a thread; root would be exempt from the limit.
as_pg bash -c 'ulimit -u 1 && exec "$@"' relay "$relay_bin" --relay threads --dsn "$dsn" --sink "$sink" \
    --topics s_threads --parallel 4 --connections 2 --once >"$dir/threads.out" 2>"$dir/threads.err"
status=$?
check "threads: exit 1 (exit $status)" test "$status" -eq 1
check "threads: it says which limit and what to lower" \
    grep -q "a limit on threads applies (ulimit -u, systemd's TasksMax): lower --parallel or --connections" \
    "$dir/threads.err"
check "threads: no abort" test "$(grep -c "terminate called" "$dir/threads.err")" = 0
check "threads: the events wait, no attempt counted" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_threads' AND state = 'pending' AND attempts = 0" 3

# ---------------------------------------------------------------- a failed ack
log "outbox_ack refused: unhealthy, stop, exit 1"
sql -c "SELECT idempotency.outbox_enqueue('s_noack', jsonb_build_object('seq', g, 'script', s::jsonb), 'na' || g)
        FROM (VALUES (1, '[\"200\"]'), (2, '[\"delay:3\"]')) v(g, s)" >/dev/null
start_relay noack --dsn "host=$dir port=$port dbname=$db user=relay_noack" --sink "$sink" --topics s_noack \
    --parallel 2 --lease 5s --http-timeout 4s --progress-interval 0 --metrics-addr 127.0.0.1:0
noack_pid=$relay_pid
wait_until 15 grep -q "metrics on http://127.0.0.1:" "$dir/noack.err"
noack_port=$(sed -nE 's|.*metrics on http://127.0.0.1:([0-9]+)/metrics.*|\1|p' "$dir/noack.err" | head -n 1)
healthz() {
    $python -c "
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen('http://127.0.0.1:$1/healthz', timeout=2)
    sys.exit(1)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 503 else 1)
except OSError:
    sys.exit(1)"
}
check "noack: /healthz turns 503 while the relay stops" wait_until 10 healthz "$noack_port"
own_exit "$noack_pid" 20
check "noack: the relay stops by itself with exit 1 (exit $status)" test "$status" = 1
check "noack: it says why" grep -q "outbox_ack.*stopping" "$dir/noack.err"
check "noack: the acked-in-vain event was sent once, not again and again" test "$(received s_noack)" = 2
if [ "$status" = running ]; then stop_relay "$noack_pid" 5 KILL; fi

# ---------------------------------------------------------------- drain bound
log "SIGTERM with a slow receiver: bounded by the delivery in progress"
sql -c "SELECT idempotency.outbox_enqueue('s_bound', jsonb_build_object('seq', g, 'script', '[\"delay:1\"]'::jsonb), 'b' || g)
        FROM generate_series(1, 20) g" >/dev/null
start_relay bound --dsn "$dsn" --sink "$sink" --topics s_bound --batch 20 --lease 60s --http-timeout 3s \
    --progress-interval 0
bound_pid=$relay_pid
wait_until 30 received_at_least s_bound 2
signalled=$($python -c 'import time; print(time.time())')
started=$SECONDS
stop_relay "$bound_pid" 30
status=$?
took=$((SECONDS - started))
check "bound: SIGTERM exits 0 within --http-timeout and a little ($took s)" test "$status" -eq 0 -a "$took" -le 6
late=$($python -c "
import json
print(sum(1 for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic'] == 's_bound' and e['t'] > $signalled + 0.5))")
check "bound: no delivery started after the signal ($late did)" test "$late" = 0
bound_delivered=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_bound' AND state = 'delivered'")
check "bound: the $((20 - bound_delivered)) events not delivered are pending again, no attempt counted" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_bound' AND state = 'pending' AND attempts = 0" $((20 - bound_delivered))

# ---------------------------------------------------------------- memory
log "--max-in-flight-bytes bounds memory, not the event count"
sql >/dev/null <<'SQL'
SET idempotency.max_value_bytes = '4MB';
SELECT idempotency.outbox_enqueue('s_big', jsonb_build_object('seq', g, 'pad', repeat('x', 2000000),
                                  'script', '["delay:0.05"]'::jsonb))
  FROM generate_series(1, 20) g;
SQL
start_relay big --dsn "$dsn" --sink "$sink" --topics s_big --parallel 2 --max-in-flight-bytes 4MB \
    --progress-interval 0
big_pid=$relay_pid
wait_until 60 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_big' AND state = 'delivered'" 20
check "memory: 20 events of 2 MB delivered ($(states s_big))" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_big' AND state = 'delivered'" 20
peak_kb=$(sed -nE 's/^VmHWM:\s+([0-9]+) kB/\1/p' "/proc/$big_pid/status" 2>/dev/null)
check "memory: the relay's peak resident size stays near the bound (${peak_kb:-?} kB for 40 MB of events)" \
    test "${peak_kb:-999999}" -lt 49152
stop_relay "$big_pid" 20

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
expect_delivered "order: 400 events delivered" 90 s_order 400 order
stop_relay "$order_pid" 20 INT
check "order: SIGINT exits 0" test $? -eq 0
check "order: per-key order at the receiver" $python "$here/check.py" order --every "$dir/receiver.jsonl" s_order
concurrency=$($python -c "
import json
print(max([e['concurrent'] for e in map(json.loads, open('$dir/receiver.jsonl')) if e['topic']=='s_order'] or [0]))")
check "order: deliveries overlapped (at most $concurrency at once)" test "$concurrency" -ge 2

# ---------------------------------------------------------------- connections
log "--connections 2: two lanes share the work, per-key order holds, one stop drains both"
sql <<'SQL' >/dev/null
SELECT idempotency.outbox_enqueue('s_lanes',
         jsonb_build_object('seq', g, 'script',
           CASE WHEN g % 41 = 0 THEN '["500", "delay:0.003"]'::jsonb ELSE '["delay:0.003"]'::jsonb END),
         CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || (g * 7 % 13) END)
  FROM generate_series(1, 600) g;
SQL
start_relay lanes --dsn "$dsn" --sink "$sink" --topics s_lanes --connections 2 --parallel 2 \
    --batch 20 --poll-interval 200ms --progress-interval 0
lanes_pid=$relay_pid
check "connections: the relay holds two database connections" wait_until 20 \
    sql_is "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-relay'" 2
expect_delivered "connections: 600 events delivered" 90 s_lanes 600 lanes
stop_relay "$lanes_pid" 20
check "connections: SIGTERM exits 0" test $? -eq 0
check "connections: one last line for the whole relay, counting every lane's deliveries" \
    test "$(grep -c 'stopped: delivered=600 ' "$dir/lanes.err")" = 1
check "connections: per-key order at the receiver" $python "$here/check.py" order --every "$dir/receiver.jsonl" s_lanes
dump
check "connections: every event accepted by the receiver" $python "$here/check.py" complete "$dir/receiver.jsonl" "$dir/outbox.dump" s_lanes
check "connections: duplicates only with the same Idempotency-Key" $python "$here/check.py" dups "$dir/receiver.jsonl" s_lanes
# A lane that fails stops the others: the relay exits 1 instead of running on.
sql -c "SELECT idempotency.outbox_enqueue('s_lanes_noack', jsonb_build_object('seq', g), 'ln' || g)
        FROM generate_series(1, 40) g" >/dev/null
start_relay lanes_noack --dsn "host=$dir port=$port dbname=$db user=relay_noack" --sink "$sink" \
    --topics s_lanes_noack --connections 3 --batch 5 --lease 5s --http-timeout 2s --progress-interval 0
lanes_noack_pid=$relay_pid
own_exit "$lanes_noack_pid" 20
check "connections: an ack refused in one lane stops every lane, exit 1 (exit $status)" test "$status" = 1
if [ "$status" = running ]; then stop_relay "$lanes_noack_pid" 5 KILL; fi

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
expect_delivered "kill: the restarted relay delivers every event" 90 s_kill 300 kill2
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
# Under load the enqueuer may end before the server accepts again, and the
# relay may have delivered all it had: events enqueued once the server is
# back can only reach the receiver through a reconnected relay.
for i in $(seq 151 160); do
    if sql -c "SELECT idempotency.outbox_enqueue('s_restart', '{\"seq\": $i}', 'k$((i % 5))')" >/dev/null; then
        echo "$i ok" >>"$dir/enqueuer.out"
    fi
done
committed=$(grep -c ' ok$' "$dir/enqueuer.out")
wait_until 90 sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_restart' AND state <> 'delivered'" 0
check "restart: the relay lived through it" kill -0 "$restart_pid"
if wait_until 60 grep -q "reconnected to the database" "$dir/restart.err"; then ok "restart: the relay reconnected"
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

# ---------------------------------------------------------------- read-only
log "a database fenced read-only: the reconnections back off until a claim succeeds"
sql -c "SELECT idempotency.outbox_enqueue('s_fenced', jsonb_build_object('seq', g), 'f' || g) FROM generate_series(1, 5) g" >/dev/null
sql -c "ALTER DATABASE $db SET default_transaction_read_only = on"
start_relay fenced --dsn "$dsn" --sink "$sink" --topics s_fenced --progress-interval 0
fenced_pid=$relay_pid
# Every claim fails with 25006 and each reconnection succeeds: the delay
# before the next one grows (100 ms doubling) instead of starting again.
grown() { grep -qE "connection lost: .*25006.*reconnecting in ([2-9][0-9]{3}|[1-9][0-9]{4,}) ms" "$dir/fenced.err"; }
if wait_until 60 grown; then
    ok "fenced: the delay between reconnections grows past 2 s ($(grep -c 'connection lost' "$dir/fenced.err") losses)"
else
    not_ok "fenced: the delay between reconnections grows past 2 s" \
        "$(grep -c 'connection lost' "$dir/fenced.err") losses: $(grep 'connection lost' "$dir/fenced.err" | tail -n 2)"
fi
check "fenced: nothing was delivered behind the fence" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_fenced' AND state = 'pending' AND attempts = 0" 5
sql -c "SET default_transaction_read_only = off" -c "ALTER DATABASE $db RESET default_transaction_read_only"
expect_delivered "fenced: once the fence is lifted, every event is delivered" 60 s_fenced 5 fenced
stop_relay "$fenced_pid" 15
status=$?
check "fenced: the relay stops with exit 0 (exit $status)" test "$status" -eq 0

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
released=$(sed -n 's/.*releasing the \([0-9]*\) event(s) not started.*/\1/p' "$dir/drain.err")
check "drain: it said how many events had not started (${released:-none}), at most a batch" \
    test -n "$released" -a "${released:-0}" -le 6

# ---------------------------------------------------------------- hangup
log "SIGHUP: a graceful stop, as SIGTERM"
sql -c "SELECT idempotency.outbox_enqueue('s_hup', jsonb_build_object('seq', g, 'script', '[\"delay:0.3\"]'::jsonb), 'h' || g)
        FROM generate_series(1, 30) g" >/dev/null
start_relay hup --dsn "$dsn" --sink "$sink" --topics s_hup --parallel 2 --batch 6 --lease 20s \
    --http-timeout 5s --progress-interval 0
hup_pid=$relay_pid
wait_until 30 received_at_least s_hup 2
started=$SECONDS
stop_relay "$hup_pid" 15 HUP
status=$?
check "hangup: SIGHUP exits 0 in $((SECONDS - started)) s (status $status)" test "$status" -eq 0
check "hangup: nothing left in flight" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_hup' AND state = 'in_flight'" 0
delivered=$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_hup' AND state = 'delivered'")
check "hangup: the $((30 - delivered)) events not delivered are pending, no attempt counted" \
    sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_hup' AND state = 'pending' AND attempts = 0" $((30 - delivered))
check "hangup: it said so on stderr" grep -q "stopping" "$dir/hup.err"

# ---------------------------------------------------------------- secrets
log "secrets off the command line: IDEM_RELAY_SINK, IDEM_RELAY_DSN, --sink-file; every userinfo part redacted"
# A token as the URL's bare user name, a password, and a token in the query.
sql -c "SELECT idempotency.outbox_enqueue('s_secret', jsonb_build_object('seq', g), 'sec' || (g % 3)) FROM generate_series(1, 6) g" >/dev/null
secret_sink="http://T0kenUser@${sink#http://}?token=Qu3rySecret"
IDEM_RELAY_SINK=$secret_sink IDEM_RELAY_DSN=$dsn start_relay secret1 --topics s_secret --progress-interval 0
secret_pid=$relay_pid
expect_delivered "secrets: IDEM_RELAY_SINK and IDEM_RELAY_DSN read from the environment, events delivered" 30 s_secret 6 secret1
cmdline=$(tr '\0' ' ' <"/proc/$secret_pid/cmdline" 2>/dev/null)
check "secrets: nothing secret on the command line ($cmdline)" \
    bash -c '[ -n "$1" ] && ! grep -qE "T0ken|Qu3ry|dbname" <<<"$1"' _ "$cmdline"
stop_relay "$secret_pid" 15
check "secrets: the environment's relay stops with exit 0" test $? -eq 0
check "secrets: a token given as the user name and the query's token are not logged" \
    bash -c '! grep -qE "T0ken|Qu3ry" "$1" && grep -q "http://\*\*\*@127.0.0.1:[0-9]*/events?token=\*\*\*" "$1"' _ "$dir/secret1.err"
sql -c "SELECT idempotency.outbox_enqueue('s_secret', jsonb_build_object('seq', 6 + g), 'sec' || (g % 3)) FROM generate_series(1, 6) g" >/dev/null
printf '%s\n' "http://user:Pa55word@${sink#http://}?token=Qu3rySecret" >"$dir/sink.secret"
chmod 600 "$dir/sink.secret"
chown "$IDEM_OS_USER" "$dir/sink.secret" 2>/dev/null
start_relay secret2 --dsn "$dsn" --sink-file "$dir/sink.secret" --topics s_secret --progress-interval 0
secret_pid=$relay_pid
expect_delivered "secrets: --sink-file read, events delivered" 30 s_secret 12 secret2
cmdline=$(tr '\0' ' ' <"/proc/$secret_pid/cmdline" 2>/dev/null)
check "secrets: --sink-file keeps the sink off the command line" \
    bash -c '[ -n "$1" ] && ! grep -qE "Pa55|Qu3ry" <<<"$1"' _ "$cmdline"
stop_relay "$secret_pid" 15
check "secrets: --sink-file's password and query are not logged, nor the user name" \
    bash -c '! grep -qE "Pa55|Qu3ry|user:" "$1" && grep -q "http://\*\*\*:\*\*\*@127.0.0.1" "$1"' _ "$dir/secret2.err"

# ---------------------------------------------------------------- tls
log "TLS with a private CA: --ca-file, --client-cert, --client-key"
if make_test_ca "$dir/tls"; then
    # An HTTPS receiver whose certificate a private CA signed, and that wants
    # a client certificate from that CA.
    $python - "$dir/tls" "$dir/tls.port" "$dir/tls.jsonl" 2>"$dir/tls_receiver.err" <<'PY' &
import http.server, json, ssl, sys
d, port_file, log = sys.argv[1:4]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(log, "a") as f:
            f.write(json.dumps({"id": self.headers.get("X-Outbox-Id"), "body": body.decode()}) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(d + "/server.pem", d + "/server.key")
context.load_verify_locations(d + "/ca.pem")
context.verify_mode = ssl.CERT_REQUIRED
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
PY
    pids+=($!)
    wait_until 10 test -s "$dir/tls.port"
    tls_sink="https://127.0.0.1:$(cat "$dir/tls.port")/events"
    sql -c "SELECT idempotency.outbox_enqueue('s_tls', jsonb_build_object('seq', g), 't' || g) FROM generate_series(1, 3) g" >/dev/null
    # Without the CA: the certificate is not trusted, the sink misconfigured.
    start_relay tls1 --dsn "$dsn" --sink "$tls_sink" --topics s_tls --http-timeout 2s --progress-interval 0
    own_exit "$relay_pid" 30
    check "tls: an untrusted certificate stops the relay (exit $status) and says why, the events pending with no attempt ($(states s_tls))" \
        bash -c '[ "$1" = 1 ] && grep -q "not trusted: give its CA with --ca-file" "$2" && [ "$3" = 3 ]' _ "$status" "$dir/tls1.err" \
        "$(sql -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 's_tls' AND state = 'pending' AND attempts = 0")"
    [ "$status" = running ] && stop_relay "$relay_pid" 20
    once tls2 60 --dsn "$dsn" --sink "$tls_sink" --topics s_tls --ca-file "$dir/tls/ca.pem" \
        --client-cert "$dir/tls/client.pem" --client-key "$dir/tls/client.key"
    status=$?
    check "tls: with --ca-file and a client certificate every event is delivered (exit $status, $(states s_tls))" \
        test "$status" -eq 0 -a "$(states s_tls)" = "delivered=3"
    check "tls: the receiver has each once" test "$(grep -c . "$dir/tls.jsonl" 2>/dev/null)" = 3
else
    not_ok "tls: openssl made a private CA"
fi

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
# A session setting a DBA may have set for the role or database: float8
# written with one significant digit ("2e+09" for a time since the epoch).
start_relay notify --dsn "host=$dir port=$port dbname=$db user=relay_monitor options='-c extra_float_digits=-15'" \
    --sink "$sink" --topics s_notify --poll-interval 60s --progress-interval 1s --metrics-addr 0.0.0.0:0
notify_pid=$relay_pid
# Any address: here every IPv4 address, reached through loopback.
wait_until 15 grep -q "metrics on http://0.0.0.0:" "$dir/notify.err"
metrics_port=$(sed -nE 's|.*metrics on http://0.0.0.0:([0-9]+)/metrics.*|\1|p' "$dir/notify.err" | head -n 1)
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
# The one event's time from enqueue to ack, from its enqueued_at: a sum
# above zero (a delay below it counts as 0) and not years off, under
# extra_float_digits = -15.
delay_sum=$(sed -nE 's/^idem_relay_delivery_delay_seconds_sum\{relay="notify"\} (.*)$/\1/p' <<<"$metrics")
check "metrics: the delivery delay read from enqueued_at is above 0 and below 600 s (${delay_sum:-none})" \
    $python -c "import sys; sys.exit(0 if 0 < float('${delay_sum:-nan}') < 600 else 1)"
health=$($python -c "
import urllib.request
print(urllib.request.urlopen('http://127.0.0.1:${metrics_port:-1}/healthz', timeout=5).read().decode().strip())" 2>&1)
check "metrics: /healthz says ok" test "$health" = ok
# Slow clients: three connections that send one byte every 1.5 s. Each
# /healthz probe beside them must still answer within its 1 s timeout.
slow=$($python - "${metrics_port:-1}" <<'PY'
import socket, sys, time, urllib.request
port = int(sys.argv[1])
slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
answered, closed = 0, 0
for round in range(4):
    for s in slow:
        try:
            s.send(b"G")
        except OSError:
            pass
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=1).read()
        answered += body.strip() == b"ok"
    except OSError:
        pass
    time.sleep(1.5)
for s in slow:
    s.settimeout(1)
    try:
        closed += s.recv(1) == b""
    except OSError:
        pass
print(answered, closed)
PY
)
check "metrics: beside three clients sending a byte every 1.5 s, every /healthz probe answers within 1 s (answered, slow ones closed: ${slow:-none})" \
    test "${slow% *}" = 4
check "progress: a periodic line on stderr with delivered, retried, dead and lag" \
    grep -qE 'delivered=1 retried=0 dead=0 in_flight=0 lag=[0-9.]+s' "$dir/notify.err"
# A burst of small transactions over three keys: every one must arrive by
# LISTEN alone, including those whose notification came in while the relay
# was busy with a claim or an ack (a missed wake-up would wait for the poll).
for i in $(seq 2 41); do
    echo "SELECT idempotency.outbox_enqueue('s_notify', '{\"seq\": $i}', 'n$((i % 3))');"
    echo "SELECT pg_sleep(0.003);"
done | sql >/dev/null
expect_delivered "notify: a burst of 40 commits all delivered by LISTEN alone" 10 s_notify 41
stop_relay "$notify_pid" 20
check "notify: SIGTERM exits 0" test $? -eq 0

# ---------------------------------------------------------------- final
log "final count"
once final 60 --dsn "$dsn" --sink "$sink" \
    --topics s_script,s_refused,s_order,s_kill,s_restart,s_drain,s_once,s_notify,s_misconf,s_misconf2,s_after,s_once_dead,s_slow,s_noack,s_bound,s_big,s_lanes,s_lanes_noack,s_hup,s_secret,s_threads
check "final: a last --once run exits 0" test $? -eq 0
sql -c "DELETE FROM idempotency.outbox WHERE topic IN ('s_stdout', 's_pgenv', 's_pipe', 's_trim_a', 's_trim_b', 's_tls') OR payload->>'expect' = 'pending'"
dump
check "final: every committed event delivered (or dead as scripted), never a rolled-back one" \
    $python "$here/check.py" complete "$dir/receiver.jsonl" "$dir/outbox.dump" --discarded "$dead_ids"
check "final: per-key order kept at the receiver" $python "$here/check.py" order "$dir/receiver.jsonl"
check "final: duplicates only with the same Idempotency-Key" $python "$here/check.py" dups "$dir/receiver.jsonl"
check "final: nothing left in flight" sql_is "SELECT count(*) FROM idempotency.outbox WHERE state = 'in_flight'" 0

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
