#!/usr/bin/env bash
# versions_agree.sh MAJORS...: the files that name versions say the same:
# META.json is META.json.in with the control file's default_version, its lowest
# PostgreSQL is the lowest major tested, its tested majors are MAJORS, the
# control file's comment names them, and debian/pgversions starts there;
# default_version has a full install script, META.json names it, and the
# chain of updates from the oldest full script reaches default_version;
# CMake takes the same version. Without MAJORS, META.json's tested ones.
set -u
cd "$(dirname "$0")/../.."
majors=$*
fail() { echo "versions disagree: $*" >&2; exit 1; }
default=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
[ "$(sed "s/@VERSION@/$default/g" META.json.in)" = "$(cat META.json)" ] ||
    fail "META.json is not META.json.in with version $default (make META.json)"
meta=$(sed -n 's/^   "version": "\(.*\)",$/\1/p' META.json)
[ -n "$default" ] && [ "$default" = "$meta" ] ||
    fail "control default_version '$default', META.json version '$meta'"
# Full install scripts: the oldest, where the chain of updates starts, and
# default_version's own (a new install runs it; an older install follows
# the chain, which test/tap/030_install_script.pl proves ends the same).
full=$(cd src/extension && ls idempotency--*.sql | grep -v -- '--.*--' |
    sed 's/^idempotency--//; s/\.sql$//' | sort -V)
echo "$full" | grep -qxF "$default" || fail "no full install script idempotency--$default.sql"
grep -q "\"file\": \"src/extension/idempotency--$default.sql\"" META.json ||
    fail "META.json does not name idempotency--$default.sql"
version=$(echo "$full" | head -n 1)
while [ "$version" != "$default" ]; do
    next=$(cd src/extension && ls "idempotency--$version--"*.sql 2>/dev/null | head -n 1)
    [ -n "$next" ] || fail "no update script from $version towards $default"
    version=${next#idempotency--$version--}; version=${version%.sql}
done
# The SQL edition: the same default_version, reached from its first
# version (0.7.0) by its own chain of updates (src/sql_edition/updates/).
sql_default=$(sed -n "s/^default_version = '\(.*\)'/\1/p" src/sql_edition/idempotency_sql.control)
[ "$sql_default" = "$default" ] ||
    fail "src/sql_edition/idempotency_sql.control default_version '$sql_default', the extension's '$default'"
version=0.7.0
while [ "$version" != "$default" ]; do
    next=$(cd src/sql_edition/updates && ls "$version--"*.sql 2>/dev/null | head -n 1)
    [ -n "$next" ] || fail "no SQL edition update from $version towards $default (src/sql_edition/updates/)"
    version=${next#$version--}; version=${version%.sql}
done
grep -q "project(idempotency VERSION \${IDEM_VERSION}" CMakeLists.txt || fail "CMakeLists.txt does not take the control file's version"
majors=${majors:-$(sed -n 's/^   "x_postgresql_tested": \[\(.*\)\],$/\1/p' META.json | tr -d '",')}
lowest=${majors%% *}
grep -q "\"PostgreSQL\": \"$lowest.0.0\"" META.json || fail "META.json does not require PostgreSQL $lowest"
tested=$(printf '"%s", ' $majors); tested="[${tested%, }]"
grep -qF "\"x_postgresql_tested\": $tested" META.json || fail "META.json does not list $tested as tested"
list=$(echo "$majors" | sed 's/ \([0-9]*\)$/ and \1/; s/ \([0-9]* and\)/, \1/g; s/ \([0-9]*\),/, \1,/g')
grep -q "^# PostgreSQL $lowest or newer; tested on $list " idempotency.control ||
    fail "the control file's comment does not say 'PostgreSQL $lowest or newer; tested on $list'"
[ "$(cat debian/pgversions)" = "$lowest+" ] || fail "debian/pgversions is not '$lowest+'"
echo "versions agree: extension $default, PostgreSQL $lowest or newer, tested on $list"
