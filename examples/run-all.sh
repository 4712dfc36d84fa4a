#!/usr/bin/env bash
# Runs the examples' checks: every examples/*/check.sh (or only the named
# ones: run-all.sh node-api consumer), one after another, each bounded in
# time. Prints "ok - example NAME" or "not ok - example NAME" per example
# and ends with "N passed, N failed"; exits non-zero if any failed.
# Run as root after the extension is installed (make install); the checks
# build nothing, start their own throwaway clusters and clean up after
# themselves. EXAMPLE_TIMEOUT (600 s) bounds each check.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
limit=${EXAMPLE_TIMEOUT:-600}
passed=0
failed=0
failures=()

if [ $# -gt 0 ]; then
    checks=()
    for name in "$@"; do checks+=("$here/$name/check.sh"); done
else
    checks=("$here"/*/check.sh)
fi

for check in "${checks[@]}"; do
    name=$(basename "$(dirname "$check")")
    if [ ! -f "$check" ]; then
        echo "not ok - example $name: no $check"
        failed=$((failed + 1)); failures+=("$name")
        continue
    fi
    echo "== example $name"
    started=$SECONDS
    # SIGTERM at the limit lets the check's trap stop what it started.
    if timeout -k 30 "$limit" bash "$check"; then
        echo "ok - example $name ($((SECONDS - started)) s)"
        passed=$((passed + 1))
    else
        echo "not ok - example $name ($((SECONDS - started)) s)"
        failed=$((failed + 1)); failures+=("$name")
    fi
done

[ "$failed" -eq 0 ] || echo "failed examples: ${failures[*]}"
[ $((passed + failed)) -gt 0 ] || { echo "no examples found"; failed=1; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
