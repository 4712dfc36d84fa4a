#!/usr/bin/env bash
# The go-worker example end to end: a throwaway cluster, the worker built
# offline in GOPATH mode with Debian's Go and lib/pq (golang-go,
# golang-github-lib-pq-dev), then three workers run the same 20 jobs at
# once: the first is killed with SIGKILL in the middle of job 1, the other
# two run all 20 concurrently, and a fourth runs them all again afterwards.
# Checks: each job charged exactly once, every key COMPLETED, the killed
# worker's job taken over after its lease, the late run only replays.
# Needs the extension installed (make install).
# Settings: GO_WORKER_PORT (54464, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a check fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

IDEM_PACKAGES="golang-go golang-github-lib-pq-dev" ensure_packages || exit 1
example_start go-worker "${GO_WORKER_PORT:-54464}" shop
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"

log "go-worker: build (GOPATH mode, offline)"
gopath=$EXAMPLE_DIR/gopath
client=$gopath/src/github.com/idempotency/idempotency/clients/go
mkdir -p "$client" "$gopath/src/example.com/go-worker" &&
    cp "$here/../../clients/go"/*.go "$client/" && rm -f "$client"/*_test.go &&
    cp "$here/main.go" "$gopath/src/example.com/go-worker/" || example_fail "could not lay out GOPATH"
(cd "$gopath/src/example.com/go-worker" && GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off \
    GOCACHE=${GOCACHE:-$EXAMPLE_DIR/gocache} go build -o "$EXAMPLE_DIR/go-worker" .) || example_fail "go build failed"

run_worker() {  # run_worker NAME ARGS...: in the background, output in NAME.log
    local name=$1; shift
    example_bg "$EXAMPLE_DIR/$name.log" "$EXAMPLE_DIR/go-worker" -name "$name" "$@"
}
held() {
    [ "$(example_sql -d shop -c "SELECT status FROM idempotency.idem_get('charge-1', 'example.charge')")" = PROCESSING ]
}
log "go-worker: worker-3 claims job 1 and is killed (SIGKILL) in its provider call"
run_worker worker-3 -jobs 1-20 -work 30s
example_wait_for 30 held || example_fail "worker-3 did not claim job 1"
kill -KILL "$!" && { wait "$!"; } 2>/dev/null

log "go-worker: worker-1 and worker-2 run jobs 1-20 at once"
run_worker worker-1 -jobs 1-20
pid1=$!
run_worker worker-2 -jobs 1-20
pid2=$!
for pid in "$pid1" "$pid2"; do
    wait "$pid" || example_fail "a worker failed"
done

log "go-worker: a late run replays every job"
"$EXAMPLE_DIR/go-worker" -name late -jobs 1-20 >"$EXAMPLE_DIR/late.log" 2>&1 || example_fail "the late run failed"

charges=$(example_sql -d shop -c "SELECT count(*) || ' ' || count(DISTINCT job_id) FROM charges")
[ "$charges" = "20 20" ] || example_fail "charges (rows, jobs): $charges, want 20 20"
echo "ok - 20 jobs, 20 charges, none twice"
keys=$(example_sql -d shop -c "SELECT count(*) FROM idempotency.idempotency_keys
    WHERE scope = 'example.charge' AND status = 'COMPLETED'")
[ "$keys" = 20 ] || example_fail "$keys keys COMPLETED, want 20"
echo "ok - every key COMPLETED"
taken=$(example_sql -d shop -c "SELECT count(*) FROM idempotency.idempotency_keys
    WHERE scope = 'example.charge' AND attempts > 1")
[ "$taken" -ge 1 ] || example_fail "no job was taken over from the killed worker"
echo "ok - $taken job(s) taken over from the killed worker"
[ "$(grep -c 'replayed true' "$EXAMPLE_DIR/late.log")" = 20 ] || example_fail "the late run did not replay all 20 jobs"
grep -q worker-3 <(example_sql -d shop -c "SELECT worker FROM charges") && example_fail "the killed worker charged"
echo "ok - the late run replayed 20 stored results and charged nothing"
echo "go-worker: all checks passed"
