#!/usr/bin/env bash
# versions_agree.sh MAJORS...: the files that name versions say the same:
# META.json's version is the control file's default_version, its lowest
# PostgreSQL is the lowest major tested, its tested majors are MAJORS, the
# control file's comment names them, and debian/pgversions starts there;
# one full install script and the chain of updates reach default_version;
# CMake takes the same version. Without MAJORS, META.json's tested ones.
set -u
cd "$(dirname "$0")/../.."
majors=$*
fail() { echo "versions disagree: $*" >&2; exit 1; }
default=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
meta=$(sed -n 's/^   "version": "\(.*\)",$/\1/p' META.json)
[ -n "$default" ] && [ "$default" = "$meta" ] ||
    fail "control default_version '$default', META.json version '$meta'"
# One full install script, the oldest, and the chain of updates from it to
# default_version (PostgreSQL installs any version by following the chain).
full=$(cd src/extension && ls idempotency--*.sql | grep -v -- '--.*--')
[ "$(echo "$full" | wc -l)" -eq 1 ] || fail "more than one full install script: $(echo $full)"
grep -q "\"file\": \"src/extension/$full\"" META.json || fail "META.json does not name $full"
version=${full#idempotency--}; version=${version%.sql}
while [ "$version" != "$default" ]; do
    next=$(cd src/extension && ls "idempotency--$version--"*.sql 2>/dev/null | head -n 1)
    [ -n "$next" ] || fail "no update script from $version towards $default"
    version=${next#idempotency--$version--}; version=${version%.sql}
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
