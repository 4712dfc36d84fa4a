#!/usr/bin/env bash
# The test runner from a checkout the `postgres` OS user cannot enter (a
# clone in root's home directory, mode 700): the tree is copied into such a
# folder and test/run.sh runs from there, with what is installed, the
# harness that once ran psql as `postgres` from the checkout
# (test/stress/outbox.sh, with a short load on a port of its own: the same
# harness may be running in make test's background lane) and the doc test.
# It must pass, and no "Permission denied" may appear in its output. Run as
# root.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/test/lib/common.sh"

[ "$(id -u)" -eq 0 ] || { echo "unreachable_checkout: run as root" >&2; exit 1; }
home=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-root-only.XXXXXX")
trap 'rm -rf "$home"' EXIT
chmod 700 "$home"
mkdir "$home/checkout"
tar -C "$root" --exclude=.git --exclude=./build --exclude='./tmp_*' -cf - . | tar -C "$home/checkout" -xf -
if as_pg test -r "$home/checkout/README.md"; then
    echo "not ok - the postgres OS user can read the root-only checkout" >&2
    exit 1
fi
out=$home/run.log
(cd "$home/checkout" && IDEM_SKIP_BUILD=1 IDEM_SUITES=harnesses STRESS_SECONDS=3 STRESS_PORT=54413 \
    IDEM_HARNESSES="test/stress/outbox.sh test/docs/run.sh" bash test/run.sh) >"$out" 2>&1
status=$?
tail -n 3 "$out"
if [ "$status" -ne 0 ]; then
    echo "not ok - test/run.sh from a root-only checkout (exit $status)"; tail -n 40 "$out"; exit 1
fi
if grep -q "Permission denied" "$out"; then
    echo "not ok - 'Permission denied' from a root-only checkout:"; grep -m 5 "Permission denied" "$out"; exit 1
fi
grep -q "^2 passed, 0 failed" "$out" || { echo "not ok - expected 2 harnesses to pass"; exit 1; }
echo "ok - test/run.sh passes from a checkout the postgres OS user cannot enter"
