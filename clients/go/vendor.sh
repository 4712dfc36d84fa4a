#!/usr/bin/env bash
# Builds vendor/ from the Go sources Debian installs under /usr/share/gocode
# (golang-github-lib-pq-dev and golang-github-jackc-pgx-v4-dev with what it
# depends on), so that `GOFLAGS=-mod=vendor go vet ./...` and `go test ./...`
# work with no module proxy. The tests run under both drivers; the package
# itself imports neither. With module access none of this is needed.
# Usage: clients/go/vendor.sh [GOCODE] (default /usr/share/gocode).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
gocode=${1:-/usr/share/gocode}
# The driver packages the tests import; vendor/ gets them and what they import.
roots="github.com/lib/pq github.com/jackc/pgx/v4/stdlib"

for root in $roots; do
    [ -d "$gocode/src/$root" ] || {
        echo "vendor.sh: no $root in $gocode (apt-get install golang-github-lib-pq-dev golang-github-jackc-pgx-v4-dev)" >&2
        exit 1
    }
done

# The modules go.mod requires, "path version" a line: vendor/ must match them.
modules=$(awk '/^require \(/ { inside = 1; next } inside && /^\)/ { inside = 0 }
               inside && NF >= 2 { print $1, $2 } /^require [^(]/ { print $2, $3 }' "$here/go.mod")

# Every non-standard package the roots need, as Debian lays them out.
packages=$(cd /tmp && GO111MODULE=off GOPATH=$gocode GOFLAGS= go list -deps $roots | grep '^[^/]*\.')

rm -rf "$here/vendor"
mkdir -p "$here/vendor"
: >"$here/vendor/modules.txt"
while read -r module version; do
    [ -f "$gocode/src/$module/go.mod" ] || { echo "vendor.sh: $module is not in $gocode" >&2; exit 1; }
    go=$(awk '$1 == "go" { print "; go " $2; exit }' "$gocode/src/$module/go.mod")
    printf '# %s %s\n## explicit%s\n' "$module" "$version" "$go" >>"$here/vendor/modules.txt"
    for pkg in $packages; do
        case $pkg/ in "$module"/*) ;; *) continue ;; esac
        # A package of a longer module path (pgproto3/v2 under pgproto3) is not this one's.
        longer=$(printf '%s\n' "$modules" | awk -v m="$module" -v p="$pkg/" \
            '$1 != m && index($1, m "/") == 1 && index(p, $1 "/") == 1' | head -n 1)
        [ -z "$longer" ] || continue
        mkdir -p "$here/vendor/$pkg"
        for file in "$gocode/src/$pkg"/*.go; do
            case $file in *_test.go) continue ;; esac
            cp "$file" "$here/vendor/$pkg/"
        done
        echo "$pkg" >>"$here/vendor/modules.txt"
    done
done <<<"$modules"
