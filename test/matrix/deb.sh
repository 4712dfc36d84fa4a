#!/usr/bin/env bash
# `make deb`: the Debian packages postgresql-<major>-idempotency and
# idem-relay for every supported major (IDEM_MATRIX_MAJORS), each built in
# the Debian release that carries that major (roots.sh), into
# build/deb/<release>/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/common.sh"
. "$here/roots.sh"
. "$here/steps.sh"
[ "$(id -u)" -eq 0 ] || { echo "make deb runs as root (debootstrap, chroot)" >&2; exit 1; }
IDEM_PACKAGES=$(idem_packages_for "$(idem_major)" roots) ensure_packages || exit 1
status=0
for major in ${IDEM_MATRIX_MAJORS:-15 17 18}; do
    log "Debian packages for PostgreSQL $major"
    build_packages "$major" || { echo "PostgreSQL $major: package build failed" >&2; status=1; }
    umount_root "$IDEM_MATRIX_CACHE/$(release_of_major "$major")/dev"
done
exit $status
