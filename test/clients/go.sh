#!/usr/bin/env bash
# The Go client's tests (clients/go, go vet and go test) against a throwaway
# cluster, offline: Debian's Go toolchain, lib/pq and pgx v4 (golang-go,
# golang-github-lib-pq-dev, golang-github-jackc-pgx-v4-dev) through a
# vendor/ tree made by clients/go/vendor.sh in a copy of the client (nothing
# is written into clients/go). go test runs twice at once, once per driver
# (IDEM_TEST_DRIVER=postgres and pgx), each in a database of its own. The
# tests: outcomes, Run, InTx, heartbeat and fencing, canonical JSON against
# what Node prints, the middleware in its three modes (concurrent
# duplicates, waiting duplicates sharing one poller, 422, 400, replays,
# rollbacks), worker processes killed with SIGKILL and paused with SIGSTOP,
# two consumers keeping per-key order, and a Node service (the Node client's
# Express middleware; express and pg installed by npm at the versions of
# clients/node's lock file) sharing keys with a Go one in each mode. Exits
# non-zero on any failure. Builds and installs the extension only when it is
# not installed (make test does it first).
# Settings: CLIENTS_GO_PORT (54473, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a test fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../examples/lib/example.sh"
package=$(cd "$here/../../clients/go" && pwd)

IDEM_PACKAGES="golang-go golang-github-lib-pq-dev golang-github-jackc-pgx-v4-dev nodejs" ensure_packages || exit 1
if [ ! -f "$("$(pg_config_path)" --sharedir)/extension/idempotency.control" ]; then
    build_and_install || exit 1
fi

example_start clients-go "${CLIENTS_GO_PORT:-54473}" clients "max_connections = 200"

log "clients/go: a copy with vendor/ from Debian's Go packages"
copy=$EXAMPLE_DIR/go
mkdir -p "$copy/clients/node" && cp -r "$package" "$copy/clients/go" && cp -r "$package/../node/src" "$copy/clients/node/" &&
    "$copy/clients/go/vendor.sh" ||
    example_fail "could not make the vendor tree"
export GOFLAGS=-mod=vendor GOCACHE=${GOCACHE:-$EXAMPLE_DIR/gocache} GOPATH=$EXAMPLE_DIR/gopath GOPROXY=off
export IDEM_TEST_ADMIN_DSN="user=postgres"

log "clients/go: npm install of express and pg for the Node service"
versions=$(node -e 'const l = require(process.argv[1]).packages;
  console.log(["express", "pg"].map((n) => `${n}@${l["node_modules/" + n].version}`).join(" "))' \
    "$package/../node/package-lock.json") || example_fail "could not read clients/node/package-lock.json"
mkdir -p "$EXAMPLE_DIR/node" &&
    (cd "$EXAMPLE_DIR/node" && example_run timeout 300 npm install --no-audit --no-fund --no-save --loglevel=error \
        $versions >"$EXAMPLE_DIR/npm.log" 2>&1) || { cat "$EXAMPLE_DIR/npm.log" >&2; example_fail "npm install failed"; }
export NODE_MODULES=$EXAMPLE_DIR/node/node_modules

cd "$copy/clients/go" || exit 1
log "clients/go: go vet"
example_run timeout 300 go vet ./... || example_fail "go vet failed"
echo "ok - go vet ./..."
# The two drivers' runs go at once, each in a database of its own: most of
# a run is spent waiting on leases and processes, not on the cores.
example_sql -d postgres -c "CREATE DATABASE clients_pgx OWNER app" >/dev/null &&
    example_sql -d clients_pgx -c "CREATE EXTENSION $(example_extension)" \
        -c "SELECT idempotency.grant_application('app')" -c "SELECT idempotency.grant_relay('app')" \
        >/dev/null || example_fail "could not create the second database"
declare -A runs=()
for driver in postgres pgx; do
    database=$PGDATABASE
    [ "$driver" = pgx ] && database=clients_pgx
    log "clients/go: go test (driver $driver, database $database), in the background"
    IDEM_TEST_DRIVER=$driver PGDATABASE=$database timeout 400 go test -count=1 -v ./... \
        >"$EXAMPLE_DIR/go-test-$driver.log" 2>&1 &
    runs[$driver]=$!
    EXAMPLE_PIDS+=($!)
done
for driver in postgres pgx; do
    wait "${runs[$driver]}"
    status=$?
    out=$EXAMPLE_DIR/go-test-$driver.log
    log "clients/go: go test (driver $driver)"
    grep -E '^(=== RUN|--- |    |ok |FAIL|PASS)' "$out" | grep -v '^=== RUN'
    [ "$status" -eq 0 ] || { tail -n 40 "$out" >&2; example_fail "clients/go tests failed under $driver"; }
    echo "go test ($driver): $(grep -c '^--- PASS' "$out") passed, $(grep -c '^--- SKIP' "$out") skipped"
done

# The whole program of docs/clients-go.md, as a user pastes it: built in
# the module (vendor/), then run twice against the database. POST /orders
# runs once per key (orders 1, 1 replayed, 2) and GET is refused; the job
# it runs at its start by key is run by the first start only.
log "clients/go: the page's whole program (service/main.go)"
program=$copy/clients/go/internal/docservice
mkdir -p "$program" &&
    awk '/^<!-- program: service\/main.go -->$/ { found = 1; next }
         found && /^```go$/ { inside = 1; next }
         inside && /^```$/ { exit }
         inside { print }' "$here/../../docs/clients-go.md" >"$program/main.go"
[ -s "$program/main.go" ] || example_fail "docs/clients-go.md has no block after <!-- program: service/main.go -->"
example_run timeout 300 go build -o "$EXAMPLE_DIR/service" ./internal/docservice || example_fail "the page's program does not build"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for start in first second; do
    out="$EXAMPLE_DIR/service-$start.log"
    PORT=$port example_bg "$out" "$EXAMPLE_DIR/service"
    example_wait_for 30 python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" ||
        example_fail "the page's program did not listen on $port"
    [ "$start" = first ] && want="replayed: false" || want="replayed: true"
    grep -qF "welcome-mail: {\"sent\": \"welcome\"} ($want)" "$out" ||
        example_fail "the $start start's job: $(cat "$out")"
    [ "$start" = second ] && break
    answers=$(python3 - "$port" <<'PY'
import sys, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/orders"
def call(method, key=None):
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    request = urllib.request.Request(base, data=b"{}" if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return f"{r.status} {r.headers.get('Idempotent-Replayed', '-')} {r.read().decode().strip()}"
    except urllib.error.HTTPError as e:
        return f"{e.code} -"
for method, key in (("POST", "k1"), ("POST", "k1"), ("POST", "k2"), ("GET", None)):
    print(call(method, key))
PY
)
    want_answers='201 - {"key":"k1","order":1}
201 true {"key":"k1","order":1}
201 - {"key":"k2","order":2}
405 -'
    [ "$answers" = "$want_answers" ] || example_fail "the page's program answered:
$answers"
    kill "${EXAMPLE_PIDS[-1]}" && wait "${EXAMPLE_PIDS[-1]}" 2>/dev/null
done
echo "ok - the page's whole program builds, answers a key once (orders 1, 1 replayed, 2), and runs its job once"
