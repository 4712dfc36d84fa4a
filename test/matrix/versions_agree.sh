#!/usr/bin/env bash
# versions_agree.sh MAJORS...: the files that name versions say the same:
# META.json's version is the control file's default_version, its lowest
# PostgreSQL is the lowest major tested, its tested majors are MAJORS, the
# control file's comment names them, and debian/pgversions starts there.
set -u
cd "$(dirname "$0")/../.."
majors=$*
fail() { echo "versions disagree: $*" >&2; exit 1; }
default=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
meta=$(sed -n 's/^   "version": "\(.*\)",$/\1/p' META.json)
[ -n "$default" ] && [ "$default" = "$meta" ] ||
    fail "control default_version '$default', META.json version '$meta'"
grep -q "\"file\": \"src/extension/idempotency--$default.sql\"" META.json ||
    fail "META.json does not name idempotency--$default.sql"
lowest=${majors%% *}
grep -q "\"PostgreSQL\": \"$lowest.0.0\"" META.json || fail "META.json does not require PostgreSQL $lowest"
tested=$(printf '"%s", ' $majors); tested="[${tested%, }]"
grep -qF "\"x_postgresql_tested\": $tested" META.json || fail "META.json does not list $tested as tested"
list=$(echo "$majors" | sed 's/ \([0-9]*\)$/ and \1/; s/ \([0-9]* and\)/, \1/g; s/ \([0-9]*\),/, \1,/g')
grep -q "^# PostgreSQL $lowest or newer; tested on $list " idempotency.control ||
    fail "the control file's comment does not say 'PostgreSQL $lowest or newer; tested on $list'"
[ "$(cat debian/pgversions)" = "$lowest+" ] || fail "debian/pgversions is not '$lowest+'"
echo "versions agree: extension $default, PostgreSQL $lowest or newer, tested on $list"
