#!/usr/bin/env bash
# monitoring/alerts.yml checked and unit-tested with promtool (Debian's
# prometheus package): every rule with no series at all, in a healthy state
# and in trouble (monitoring/alerts_test.yml). Ends with "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
promtool=$(command -v promtool) || { echo "promtool is missing"; echo "0 passed, 1 failed"; exit 1; }
passed=0
failed=0
for step in "check rules alerts.yml" "test rules alerts_test.yml"; do
    # shellcheck disable=SC2086
    if (cd "$root/monitoring" && "$promtool" $step); then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
