#!/usr/bin/env bash
# Builds the Debian packages from this source tree (a copy: the build writes
# into it) for every PostgreSQL major in debian/pgversions that this system
# supports and has the server headers of, and copies the .deb files to OUT.
# `make deb` runs it in a Debian root per major (test/matrix/deb.sh).
#   bash debian/build.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
# The package version is the extension's: one place to change it.
cat >debian/changelog <<CHANGELOG
idempotency ($version) unstable; urgency=medium

  * Version $version of the extension.

 -- The idempotency developers <maintainers@idempotency.invalid>  $(date -R -d @"${SOURCE_DATE_EPOCH:-$(stat -c %Y idempotency.control)}")
CHANGELOG
pg_buildext updatecontrol
DEB_BUILD_OPTIONS="nocheck noddebs ${DEB_BUILD_OPTIONS:-}" \
    dpkg-buildpackage --build=binary --no-sign -j"$(nproc)" >../idempotency-deb-build.log 2>&1 || {
    tail -n 40 ../idempotency-deb-build.log >&2
    exit 1
}
mkdir -p "$out"
cp ../*.deb "$out/"
ls "$out"
