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
