#!/usr/bin/env bash
# The demo under load: `make demo` five times (DEMO_RUNS) while two busy
# loops keep both cores of the machine busy, each run on a folder and port
# of its own; every run must reach its proof line ("PROOF HOLDS"). The
# demo meets NULLs a busy machine brings out (a claim answered in_progress
# while another transaction creates the key has no lease to report).
# Uses what is installed (make test has built it); ends with "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
runs=${DEMO_RUNS:-5}
log=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-demo-repeat.XXXXXX")
busy=()
stop_load() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; }
trap 'stop_load; rm -rf "$log"' EXIT
for _ in 1 2; do
    (while :; do :; done) &
    busy+=($!)
done

passed=0
failed=0
for run in $(seq 1 "$runs"); do
    started=$SECONDS
    IDEM_SKIP_BUILD=1 DEMO_SEED=$run bash "$here/run.sh" >"$log/run.$run" 2>&1
    status=$?
    if [ "$status" -eq 0 ] && grep -q '^PROOF HOLDS' "$log/run.$run"; then
        passed=$((passed + 1))
        echo "ok   demo run $run (seed $run): proof holds in $((SECONDS - started)) s"
    else
        failed=$((failed + 1))
        echo "FAIL demo run $run (seed $run, exit $status); its last lines:"
        tail -n 30 "$log/run.$run" | sed 's/^/     /'
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
