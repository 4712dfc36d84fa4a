#!/usr/bin/env bash
# After `make install` (which make test ran), `idem-relay` is on a user's
# PATH, as the README's relay command expects: with the PATH of a login
# shell (no PostgreSQL directory in it) the command is found, is the one
# installed into pg_config --bindir, and answers --version.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/common.sh"

passed=0
failed=0
check() {  # check NAME COMMAND...
    local name=$1; shift
    if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}
login_path=/usr/local/bin:/usr/bin:/bin
found=$(env -i PATH="$login_path" bash -c 'command -v idem-relay')
check "idem-relay is on the PATH of a login shell ($login_path): ${found:-not found}" test -n "$found"
check "it is the relay installed into pg_config --bindir" \
    test "$(readlink -f "$found")" = "$(readlink -f "$(pg_bindir)/idem-relay")"
check "it answers --version" env -i PATH="$login_path" idem-relay --version
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
