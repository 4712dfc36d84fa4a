#!/usr/bin/env bash
# Stages the shared behaviour tests for a run against the SQL edition:
#   stage.sh regress   DEST   sql/*.sql and expected/*.out -> DEST/sql, DEST/expected
#   stage.sh isolation DEST   test/isolation/{specs,expected} -> DEST/specs, DEST/expected
# and prints the names of the tests to run, in order. The tests are the C++
# edition's, with one change: they create and drop the extension
# idempotency_sql instead of idempotency. A test named in cpp_only.txt is
# left out (it covers what only the C++ edition has; the file says why). An
# expected output under test/sql_edition/expected/ (regress) or
# test/sql_edition/isolation_expected/ (isolation) replaces the C++
# edition's where the SQL edition answers differently by design
# (docs/managed-postgres.md lists the differences).
set -eu
kind=$1
dest=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

rename_extension() {
    sed -E 's/((CREATE|DROP|ALTER) EXTENSION (IF (NOT )?EXISTS )?)idempotency\b/\1idempotency_sql/g' "$1"
}

cpp_only() {
    sed -n -E "s/^$1 +([a-z0-9_]+):.*/\1/p" "$here/cpp_only.txt"
}

case $kind in
    regress)
        inputs=$root/sql; in_ext=sql; outputs=$root/expected; override=$here/expected
        in_dir=sql; names=$(cd "$root" && make -s -f - print-regress <<'MK'
include Makefile
print-regress: ; @echo $(REGRESS)
MK
) ;;
    isolation)
        inputs=$root/test/isolation/specs; in_ext=spec; outputs=$root/test/isolation/expected
        override=$here/isolation_expected; in_dir=specs
        names=$(cd "$inputs" && ls *.spec | sed 's/\.spec$//' | sort) ;;
    *) echo "stage.sh: regress or isolation" >&2; exit 2 ;;
esac

mkdir -p "$dest/$in_dir" "$dest/expected"
skip=" $(cpp_only "$kind" | tr '\n' ' ') "
for name in $names; do
    case $skip in *" $name "*) continue ;; esac
    rename_extension "$inputs/$name.$in_ext" >"$dest/$in_dir/$name.$in_ext"
    for out in "$outputs/$name".out "$outputs/$name"_[0-9].out; do
        [ -f "$out" ] && rename_extension "$out" >"$dest/expected/$(basename "$out")"
    done
    if [ -f "$override/$name.out" ]; then
        rm -f "$dest/expected/$name"_[0-9].out
        cp "$override/$name.out" "$dest/expected/$name.out"
    fi
    echo "$name"
done
