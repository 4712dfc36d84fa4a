#!/usr/bin/env bash
# idem-relay and the Python client through PgBouncer in transaction mode,
# as a team that puts a pooler in front of every database runs them: a
# throwaway cluster and a PgBouncer (2 server connections for the role) in
# front of it, with an application's short transactions going through the
# same pool, so that each transaction runs on whichever server backend is
# free. The relay:
#
#   burst     --connections 2 --parallel 2: every event arrives once, in
#             per-key order, and the relay says it runs through a pooler
#   runs      a hot key's events are handed out in runs (--run-length 20
#             set in each claim's transaction): far fewer claims than events
#   restart   SIGTERM, then a new relay through the same pool, whose server
#             backends the first one used: it starts and delivers (a relay
#             that prepared its statements in the session found them there
#             already, or missing, and stopped)
#   session   nothing of the relay is left in the pool's server backends:
#             no setting, no LISTEN, no prepared statement
#   direct    a direct connection is not taken for a pooler
#   python    the WSGI and ASGI middlewares, with the pools they make from
#             a conninfo (ASGI: duplicates at once waiting for the holder,
#             and transaction mode), a claim whose work outlasts its lease
#             four times, the maintenance runner and the outbox's Consumer
#             and AsyncConsumer: each key handled once, each event consumed
#             once, no error, and afterwards (the session check again)
#             no server backend holding what the client left
#             (psycopg prepares a query after 5 runs unless told not to)
#   node      the outbox's Consumer on a pg.Pool (30 events consumed once
#             each, no server backend of the pool listening for it); the
#             Express middleware, the Fastify plugin and the web-standard
#             wrapper: duplicates at once in claim mode, whose handler
#             outlasts its lease, and in transaction mode, each key handled
#             once; claim() with duplicates waiting for its holder
#   wait      idem_claim(wait => ...) holds a server connection while it
#             waits: as many waiters as the pool's connections keep the
#             holder's complete out until one gives up (in_progress);
#             fewer leave it room, and it wakes them (completed); Python's
#             claim(wait=) polls instead: 3 waiters, all completed
#   go        Run over 40 keys, each three times at once, with each driver
#             setting docs/clients-go.md gives for a pooler (lib/pq with
#             binary_parameters=yes, pgx with statement_cache_mode=describe
#             or prefer_simple_protocol=true): each key's work once, no error
#
# Run as root after the extension and idem-relay are installed (make
# install); needs pgbouncer, python3-psycopg, python3-psycopg-pool, node
# and npm (with the network, for clients/node's locked dependencies), Go
# with golang-github-lib-pq-dev and golang-github-jackc-pgx-v4-dev. Prints "ok N - ..." or "not ok N - ..." lines
# and ends with "N passed, N failed". Settings: RELAY_POOLER_PORT (54490:
# PostgreSQL; PgBouncer takes the next), IDEM_RELAY.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"
. "$here/../relay/harness.sh"

port=${RELAY_POOLER_PORT:-54490}
pooler_port=$((port + 1))
bindir=$(pg_bindir)
relay_bin=${IDEM_RELAY:-$bindir/idem-relay}
python=python3
db=relay_pooler
passed=0
failed=0
number=0
pids=()

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-pooler.XXXXXX") || exit 1
chmod 755 "$dir"
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    pkill -KILL -f "pgbench -h 127.0.0.1 -p $pooler_port " 2>/dev/null
    [ -f "$dir/pgbouncer.pid" ] && kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null
    stop_cluster "$dir"
    if [ "$failed" -eq 0 ] && [ -z "${RELAY_TEST_KEEP:-}" ]; then rm -rf "$dir"; else echo "outputs kept in $dir" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
give_up() { echo "pooler: $1" >&2; [ $# -gt 1 ] && tail -n 20 "$2" >&2; echo "$passed passed, $((failed + 1)) failed"; exit 1; }

# ---------------------------------------------------------------- setup
[ -x "$relay_bin" ] || give_up "idem-relay not found at $relay_bin: run make install first"
command -v pgbouncer >/dev/null || give_up "pgbouncer is missing (apt-get install pgbouncer)"
log "relay through a pooler: cluster in $dir, port $port, PgBouncer on $pooler_port"
start_cluster "$dir" "$port" "log_min_messages = warning" || give_up "could not start the cluster" "$dir/server.log"
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || give_up "createdb failed"
sql <<'SQL' || give_up "setup failed"
CREATE EXTENSION idempotency;
CREATE ROLE relay_app LOGIN;
SELECT idempotency.grant_relay('relay_app');
SQL
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$db = host=$dir port=$port dbname=$db
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pooler_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/pgbouncer.users
pool_mode = transaction
ignore_startup_parameters = extra_float_digits
default_pool_size = 2
max_client_conn = 100
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
printf '"relay_app" ""\n"postgres" ""\n' >"$dir/pgbouncer.users"
chown "$IDEM_OS_USER" "$dir/pgbouncer.ini" "$dir/pgbouncer.users"
as_pg pgbouncer -d "$dir/pgbouncer.ini" || give_up "PgBouncer did not start" "$dir/pgbouncer.log"
pooled() { as_pg "$bindir/psql" -X -q -At -h 127.0.0.1 -p "$pooler_port" -U relay_app -d "$db" -v ON_ERROR_STOP=1 "$@"; }
wait_until 20 pooled -c "SELECT 1" >/dev/null || give_up "PgBouncer does not answer" "$dir/pgbouncer.log"
pooled_dsn="host=127.0.0.1 port=$pooler_port dbname=$db user=relay_app"

# An application's short transactions through the same pool (same role and
# database), so that consecutive transactions of the relay land on
# different server backends.
printf 'SELECT pg_sleep(0.002);\n' >"$dir/app.sql"
chmod 644 "$dir/app.sql"
start_app_load() {
    as_pg "$bindir/pgbench" -h 127.0.0.1 -p "$pooler_port" -U relay_app -n -c 4 -T 600 \
        -f "$dir/app.sql" "$db" >"$dir/app.log" 2>&1 &
    app_pid=$!
    pids+=("$app_pid")
}
# (pgbench itself: the signal would stop only runuser, which does not pass it on.)
stop_app_load() {
    pkill -TERM -f "pgbench -h 127.0.0.1 -p $pooler_port " 2>/dev/null
    wait "$app_pid" 2>/dev/null
}

# enqueue TOPIC FROM TO KEYS: events FROM..TO (seq) over KEYS keys.
enqueue() {
    sql -c "SELECT count(idempotency.outbox_enqueue('$1', jsonb_build_object('seq', g), 'k' || (g % $4)))
            FROM generate_series($2, $3) g" >/dev/null
}
# in_order FILE TOPIC COUNT: the stdout sink's lines of TOPIC hold COUNT
# distinct events, each once, and each key's in seq order.
in_order() {
    $python - "$1" "$2" "$3" <<'PY'
import json, sys
path, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids, last = set(), {}
for line in open(path):
    e = json.loads(line)
    if e["topic"] != topic:
        continue
    if e["id"] in ids:
        sys.exit(f"event {e['id']} delivered twice")
    ids.add(e["id"])
    seq = e["payload"]["seq"]
    if last.get(e["key"], 0) > seq:
        sys.exit(f"key {e['key']}: {seq} after {last[e['key']]}")
    last[e["key"]] = seq
if len(ids) != count:
    sys.exit(f"{len(ids)} events, not {count}")
PY
}
# report_lines FILE: the "ok ..." and "not ok ..." lines a client's run printed.
report_lines() {
    local line
    while read -r line; do
        case $line in
            "ok "*) ok "${line#ok }" ;;
            "not ok "*) not_ok "${line#not ok }" ;;
        esac
    done <"$1"
}
metric() {  # metric PORT NAME: the value of NAME in the relay's /metrics
    $python -c "
import re, sys, urllib.request
text = urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=5).read().decode()
m = re.search(r'^$2\{[^}]*\} (\S+)$', text, re.M)
print(int(float(m.group(1))) if m else -1)"
}

# ---------------------------------------------------------------- burst
start_app_load
enqueue burst 1 600 20
start_relay r1 --dsn "$pooled_dsn" --sink stdout --topics burst,hot --connections 2 --parallel 2 \
    --batch 20 --run-length 20 --progress-interval 0 --metrics-addr 127.0.0.1:0
relay1=$relay_pid
expect_delivered "burst: 600 events delivered through the pooler" 90 burst 600 r1
check "burst: each once, in per-key order" in_order "$dir/r1.out" burst 600
check "burst: the relay says it runs through a pooler" grep -q "through a pooler" "$dir/r1.err"
no_error() { ! grep -q ERROR "$dir/$1.err"; }
check "burst: no error" no_error r1

# ---------------------------------------------------------------- runs
wait_until 15 grep -q "metrics on http://127.0.0.1:" "$dir/r1.err"
metrics_port=$(sed -nE 's|.*metrics on http://127.0.0.1:([0-9]+)/metrics.*|\1|p' "$dir/r1.err" | head -n 1)
claims_before=$(metric "${metrics_port:-1}" idem_relay_claims_total)
enqueue hot 1 60 1
expect_delivered "runs: 60 events of one key delivered" 60 hot 60 r1
claims=$(( $(metric "${metrics_port:-1}" idem_relay_claims_total) - claims_before ))
# Runs of 20: 3 claims and the polls meanwhile; one event a claim: 60.
check "runs: the hot key took $claims claims for 60 events (runs of 20 set in each transaction)" \
    test "$claims" -ge 3 -a "$claims" -le 30
check "runs: in order" in_order "$dir/r1.out" hot 60

# ---------------------------------------------------------------- restart
stop_relay "$relay1" 20
check "restart: the first relay exits 0 on SIGTERM (exit $?)" test "$?" = 0
enqueue burst 601 700 20
start_relay r2 --dsn "$pooled_dsn" --sink stdout --topics burst --connections 2 --parallel 2 \
    --batch 20 --progress-interval 0
relay2=$relay_pid
expect_delivered "restart: a second relay through the same pool delivers the rest" 60 burst 700 r2
check "restart: no error" no_error r2
stop_relay "$relay2" 20
check "restart: the second relay exits 0 on SIGTERM (exit $?)" test "$?" = 0

# ---------------------------------------------------------------- session
# Two transactions at once take both server backends of the pool: each
# tells what its session holds. A relay or client that set its settings,
# LISTENed or prepared in the session left them on one of these. Checked
# right after the relay, before any client has used the pool, and again
# after the Python client (a heartbeat that prepared, for one, fails only
# some of its beats). The application's load goes on meanwhile: stopping
# it mid-transaction would make PgBouncer close the server connections it
# held, and with them what they held.
session_state() {
    local i probes=()
    for i in 1 2; do
        pooled -F ' ' -c "BEGIN" -c "SELECT pg_backend_pid(),
              current_setting('idle_in_transaction_session_timeout'),
              coalesce(current_setting('idempotency.outbox_run_length', true), 'unset'),
              (SELECT count(*) FROM pg_listening_channels()),
              (SELECT count(*) FROM pg_prepared_statements)" -c "SELECT pg_sleep(1)" -c "COMMIT" \
            >"$dir/session.$i" &
        probes+=($!)
    done
    wait "${probes[@]}"
    grep -h -v '^$' "$dir/session.1" "$dir/session.2" >"$dir/session.txt"
    [ "$(cut -d ' ' -f 1 "$dir/session.txt" | sort -u | wc -l)" = 2 ]
}
# pid, idle_in_transaction_session_timeout, run length, channels, statements
session_clean() { awk '$2 != "0" || $3 == "20" || $4 != 0 || $5 != 0 { bad = 1 } END { exit bad }' "$dir/session.txt"; }
# session_check WHO: the check, after WHO used the pool.
session_check() {
    if ! wait_until 30 session_state; then
        not_ok "session: two server backends seen at once" "$(cat "$dir/session.txt")"
    elif session_clean; then
        ok "session: neither server backend holds a setting, a LISTEN or a prepared statement of $1"
    else
        not_ok "session: a server backend holds what $1 left" "$(cat "$dir/session.txt")"
    fi
}
session_check "the relay"

# ---------------------------------------------------------------- python
# The same role as the application's load, so that it shares its pool.
sql -c "SELECT idempotency.grant_application('relay_app'), idempotency.grant_admin('relay_app')" >/dev/null
# The tables the middlewares' handlers write to in transaction mode.
sql -c "CREATE TABLE asgi_effects (key text); CREATE TABLE express_effects (key text);
        CREATE TABLE fastify_effects (key text); CREATE TABLE web_effects (key text);
        GRANT SELECT, INSERT ON asgi_effects, express_effects, fastify_effects, web_effects TO relay_app" >/dev/null
as_pg env PYTHONPATH="$IDEM_ROOT/clients/python/src" $python "$here/python_client.py" "$pooled_dsn" \
    >"$dir/python.out" 2>"$dir/python.err"
python_status=$?
report_lines "$dir/python.out"
[ "$python_status" -eq 0 ] || not_ok "python: the client's run exits 0 (exit $python_status)" "$(tail -n 15 "$dir/python.err")"
session_check "the Python client"

# ---------------------------------------------------------------- node
# A copy of the client with its locked dependencies (pg), run from there.
node_copy=$dir/node-client
mkdir -p "$node_copy" && cp -r "$IDEM_ROOT/clients/node/src" "$IDEM_ROOT/clients/node/package.json" \
    "$IDEM_ROOT/clients/node/package-lock.json" "$here/node_client.mjs" "$node_copy/" &&
    chown -R "$IDEM_OS_USER" "$node_copy" &&
    as_pg timeout 300 npm ci --prefix "$node_copy" --no-audit --no-fund --loglevel=error \
        >"$dir/npm.log" 2>&1 || give_up "npm ci of clients/node failed" "$dir/npm.log"
(cd "$node_copy" && as_pg node node_client.mjs "postgresql://relay_app@127.0.0.1:$pooler_port/$db") \
    >"$dir/node.out" 2>"$dir/node.err"
node_status=$?
report_lines "$dir/node.out"
[ "$node_status" -eq 0 ] || not_ok "node: the client's run exits 0 (exit $node_status)" "$(tail -n 15 "$dir/node.err")"

# ---------------------------------------------------------------- go
# A copy of the client with vendor/ from Debian's Go packages, and the
# check built in it; then the driver settings docs/clients-go.md gives for
# a pooler, each with keys of its own.
go_copy=$dir/go-client
mkdir -p "$go_copy/clients/go/poolercheck" && cp -r "$IDEM_ROOT/clients/go/." "$go_copy/clients/go/" &&
    cp "$here/go_client.go" "$go_copy/clients/go/poolercheck/main.go" &&
    "$go_copy/clients/go/vendor.sh" >"$dir/vendor.log" 2>&1 || give_up "could not make the Go vendor tree" "$dir/vendor.log"
(cd "$go_copy/clients/go" && GOFLAGS=-mod=vendor GOPROXY=off GOCACHE=${GOCACHE:-$dir/gocache} \
    timeout 300 go build -o "$dir/go_client" ./poolercheck) >"$dir/go_build.log" 2>&1 ||
    give_up "could not build the Go check" "$dir/go_build.log"
chmod 755 "$dir/go_client"
go_dsn="host=127.0.0.1 port=$pooler_port dbname=$db user=relay_app sslmode=disable"
for run in "postgres|$go_dsn binary_parameters=yes|lib/pq, binary_parameters=yes" \
    "pgx|$go_dsn statement_cache_mode=describe|pgx, statement_cache_mode=describe" \
    "pgx|$go_dsn prefer_simple_protocol=true|pgx, prefer_simple_protocol=true"; do
    IFS='|' read -r go_driver go_source go_label <<<"$run"
    as_pg "$dir/go_client" "$go_driver" "$go_source" "$go_label" >"$dir/go.out" 2>&1
    go_status=$?
    report_lines "$dir/go.out"
    [ "$go_status" -eq 0 ] || not_ok "go ($go_label): the run exits 0 (exit $go_status)" "$(tail -n 5 "$dir/go.out")"
done
stop_app_load

# ---------------------------------------------------------------- wait
# idem_claim(wait => ...) through the pooler: a waiting duplicate holds a
# server connection for as long as it waits (docs/waiting.md). With as many
# waiters as the pool has server connections, the holder's idem_complete
# finds none to run on until one of them gives up: it answers in_progress,
# though the holder finished right after it began to wait. With fewer
# waiters than connections, the complete runs and wakes them: completed.
waiting_sessions() {
    sql_is "SELECT count(*) FROM pg_stat_activity
            WHERE state = 'active' AND query LIKE '%wait =>%' AND pid <> pg_backend_pid()" "$1"
}
# crowd KEY WAITERS: WAITERS duplicates wait (8 s) for KEY's holder, which
# completes once they all wait; prints each waiter's outcome, sorted.
crowd() {
    local key=$1 waiters=$2 token i
    token=$(pooled -c "SELECT token FROM idempotency.idem_claim('$key', lease => '1 minute')")
    for i in $(seq "$waiters"); do
        pooled -c "SELECT outcome FROM idempotency.idem_claim('$key', wait => '8s')" >"$dir/waiter.$i" 2>&1 &
    done
    wait_until 30 waiting_sessions "$waiters" || echo "the waiters did not all wait"
    pooled -c "SELECT idempotency.idem_complete('$key', '$token', '{}')" >/dev/null
    wait
    sort "$dir"/waiter.* | paste -sd ' '
    rm -f "$dir"/waiter.*
}
outcomes=$(crowd crowd-full 2)
gave_up() { case " $outcomes " in *" in_progress "*) return 0 ;; *) return 1 ;; esac; }
check "wait: 2 waiters on a pool of 2 hold both connections; the holder's complete runs once one gives up ($outcomes)" \
    gave_up
outcomes=$(crowd crowd-room 1)
check "wait: 1 waiter on a pool of 2 leaves room for the complete, which wakes it ($outcomes)" \
    test "$outcomes" = "completed"

# The Python client's claim(conn, ..., wait=...) on a connection through the
# pooler waits off it instead (docs/clients-python.md): three duplicates,
# more than the pool's connections, each try a claim without wait. Once each
# has answered in_progress at least twice (the extension's counter: they
# all poll), the holder's complete finds a connection and they take its
# result: completed, without running the work.
in_progress_answers() { sql -c "SELECT in_progress FROM idempotency.idem_metrics"; }
polled_since() { [ "$(in_progress_answers)" -ge $(($1 + 6)) ]; }
before=$(in_progress_answers)
token=$(pooled -c "SELECT token FROM idempotency.idem_claim('python-crowd', lease => '1 minute')")
for mode in sync sync async; do
    as_pg env PYTHONPATH="$IDEM_ROOT/clients/python/src" $python "$here/python_wait.py" "$pooled_dsn" \
        python-crowd "$mode" 20 >>"$dir/python_wait.out" 2>&1 &
done
wait_until 30 polled_since "$before" || echo "the Python waiters did not poll" >>"$dir/python_wait.out"
pooled -c "SELECT idempotency.idem_complete('python-crowd', '$token', '{}')" >/dev/null
wait
outcomes=$(sort "$dir/python_wait.out" | paste -sd ' ')
check "wait: Python's claim(wait=) and aclaim(wait=), 3 on a pool of 2, poll off the pool and take the result ($outcomes)" \
    test "$outcomes" = "completed completed completed"

# ---------------------------------------------------------------- direct
once direct 30 --dsn "host=$dir port=$port dbname=$db user=relay_app" --sink stdout --topics burst
check "direct: a direct connection runs --once (exit $?)" test "$?" = 0
not_pooled() { ! grep -q "through a pooler" "$dir/$1.err"; }
check "direct: and is not taken for a pooler" not_pooled direct

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
