#!/usr/bin/env bash
# deb_install.sh MAJOR: installs the packages `make deb` built for MAJOR
# (build/deb/<release>/) into a fresh minimal system of that release with
# `apt-get install ./<file>.deb`, as a user would, then proves them: a
# cluster made with the Debian tools and the library preloaded, CREATE
# EXTENSION, a claim, an enqueue, and `idem-relay --once` delivering the
# event to stdout and acking it. The root is removed afterwards (kept on
# failure, for a look).
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/common.sh"
. "$here/roots.sh"
. "$here/steps.sh"

major=$1
release=$(release_of_major "$major") || exit 1
debs=$IDEM_DEB_OUT/$release
ext_deb=$(ls "$debs"/postgresql-"$major"-idempotency_*.deb 2>/dev/null | tail -n 1)
relay_deb=$(ls "$debs"/idem-relay_*.deb 2>/dev/null | tail -n 1)
[ -n "$ext_deb" ] && [ -n "$relay_deb" ] ||
    { echo "no packages for PostgreSQL $major in $debs: run make deb" >&2; exit 1; }

base=$(base_root "$release") || exit 1
root=$IDEM_MATRIX_CACHE/$release/install
remove_root "$root" || exit 1
cp -a "$base" "$root" && mount_root "$root" || exit 1
trap 'umount_root "$root"' EXIT

mkdir -p "$root/tmp/debs" && cp "$ext_deb" "$relay_deb" "$root/tmp/debs/" || exit 1
apt_in_root "$root" update || exit 1
log "apt-get install ./$(basename "$ext_deb") ./$(basename "$relay_deb")"
in_root "$root" sh -c 'cd /tmp/debs && apt-get -o Acquire::Check-Valid-Until=false -qq \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confold install -y ./*.deb' >/dev/null || exit 1

fail() { echo "package install test: $*" >&2; exit 1; }

# The unit the package ships is where systemd looks for it, with the
# example of a relay's options and the folder the instances read them from.
unit=$(ls "$root"/usr/lib/systemd/system/idem-relay@.service "$root"/lib/systemd/system/idem-relay@.service \
    2>/dev/null | head -n 1)
[ -n "$unit" ] || fail "no idem-relay@.service"
[ -f "$root/usr/share/doc/idem-relay/examples/NAME.conf" ] || fail "no example NAME.conf"
[ -d "$root/etc/idem-relay" ] || fail "no /etc/idem-relay"
# systemd's own check of the unit as shipped, where the host has it (no
# systemd runs here): an instance of the template, its ExecStart pointed at
# the binary the package installed into the root.
if command -v systemd-analyze >/dev/null 2>&1; then
    units=$(mktemp -d)
    sed "s|/usr/bin/idem-relay|$root/usr/bin/idem-relay|" "$unit" >"$units/idem-relay@.service"
    ln -s idem-relay@.service "$units/idem-relay@pkgtest.service"
    # It exits 0 on directives it ignores: any word from it is a failure.
    verdict=$(systemd-analyze verify "$units/idem-relay@pkgtest.service" 2>&1) && [ -z "$verdict" ] ||
        fail "systemd-analyze verify idem-relay@pkgtest.service: $verdict"
    rm -rf "$units"
fi

# A cluster as Debian makes them, on a Unix socket only: the host's network
# is shared with the root.
in_root "$root" pg_createcluster "$major" pkgtest -p 5499 \
    -o "shared_preload_libraries=idempotency" -o "listen_addresses=" >/dev/null ||
    fail "pg_createcluster"
in_root "$root" pg_ctlcluster "$major" pkgtest start || fail "the cluster did not start"

psql_in_root() {
    in_root "$root" runuser -u postgres -- psql -X -q -At -v ON_ERROR_STOP=1 -p 5499 -d postgres "$@"
}

result=$(psql_in_root <<'SQL'
CREATE EXTENSION idempotency;
SELECT outcome FROM idempotency.idem_claim('package-test', '{"n": 1}');
SELECT idempotency.outbox_enqueue('package.test', '{"n": 1}') IS NOT NULL;
SQL
) || fail "CREATE EXTENSION, claim or enqueue failed"
[ "$result" = "$(printf 'claimed\nt')" ] || fail "claim and enqueue answered '$result'"

# From 18 on the magic block names the module and its version.
if [ "$major" -ge 18 ]; then
    loaded=$(psql_in_root -c "SELECT version FROM pg_get_loaded_modules()
        WHERE module_name = 'idempotency'") || fail "pg_get_loaded_modules()"
    version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idempotency.control")
    [ "$loaded" = "$version" ] || fail "pg_get_loaded_modules() shows version '$loaded', not $version"
fi

delivered=$(in_root "$root" runuser -u postgres -- idem-relay --once \
    --dsn="host=/var/run/postgresql port=5499 dbname=postgres" --relay=pkgtest --sink=stdout --topics=package.test) ||
    fail "idem-relay --once failed"
echo "$delivered" | grep -q '"topic":"package.test"' || fail "idem-relay delivered '$delivered'"
states=$(psql_in_root -c "SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL) || ' delivered, '
    || count(*) FILTER (WHERE delivered_at IS NULL) || ' pending' FROM idempotency.outbox") ||
    fail "outbox query"
[ "$states" = "1 delivered, 0 pending" ] || fail "after idem-relay --once the outbox holds $states"

in_root "$root" pg_ctlcluster "$major" pkgtest stop -m fast
umount_root "$root"
trap - EXIT
remove_root "$root"
echo "PostgreSQL $major: packages installed and working"
