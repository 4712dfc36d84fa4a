#!/usr/bin/env bash
# Builds vendor/ from the Go sources Debian installs (golang-github-lib-pq-dev
# under /usr/share/gocode), so that `GOFLAGS=-mod=vendor go vet ./...` and
# `go test ./...` work with no module proxy. With module access, none of
# this is needed: go test fetches lib/pq itself.
# Usage: clients/go/vendor.sh [GOCODE] (default /usr/share/gocode).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
gocode=${1:-/usr/share/gocode}
src=$gocode/src/github.com/lib/pq
version=v1.10.7     # the version go.mod requires; Debian 12 packages it
[ -f "$src/conn.go" ] || { echo "vendor.sh: no lib/pq in $src (apt-get install golang-github-lib-pq-dev)" >&2; exit 1; }

rm -rf "$here/vendor"
for pkg in . oid scram; do
    mkdir -p "$here/vendor/github.com/lib/pq/$pkg"
    for file in "$src/$pkg"/*.go; do
        case $file in *_test.go) continue ;; esac
        cp "$file" "$here/vendor/github.com/lib/pq/$pkg/"
    done
done
cat >"$here/vendor/modules.txt" <<TXT
# github.com/lib/pq $version
## explicit; go 1.13
github.com/lib/pq
github.com/lib/pq/oid
github.com/lib/pq/scram
TXT
