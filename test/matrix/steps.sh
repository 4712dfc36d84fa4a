# The steps of the version matrix that run inside a Debian root: the suites
# and the package build. Sourced after common.sh and roots.sh.

IDEM_DEB_OUT=${IDEM_DEB_OUT:-$IDEM_ROOT/build/deb}

# copy_source DEST: the source tree without .git and build products.
copy_source() {
    local dest=$1
    rm -rf "$dest" && mkdir -p "$dest" || return 1
    tar -C "$IDEM_ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.d' \
        --exclude=./build --exclude=./results --exclude=./output_iso --exclude='./tmp_*' \
        -cf - . | tar -C "$dest" -xf -
}

# Compilers through ccache, its cache kept in the root: a second run of the
# matrix recompiles nothing that did not change.
in_root_cached() {
    local root=$1; shift
    in_root "$root" env PATH=/usr/lib/ccache:/usr/sbin:/usr/bin:/sbin:/bin \
        CCACHE_DIR=/var/cache/ccache "$@"
}

# suites_in_root ROOT MAJOR: test/run.sh's unit, pg_regress, isolation and
# TAP suites, built and installed inside the root against its PostgreSQL;
# the shared suites against both editions, as on the host, and the CMake
# build of the module and idem-relay besides the unit tests.
suites_in_root() {
    local root=$1 major=$2 src=/tmp/idempotency-src
    copy_source "$root$src" || return 1
    in_root_cached "$root" PG_CONFIG="/usr/lib/postgresql/$major/bin/pg_config" IDEM_UNIT_BUILD=all \
        IDEM_SUITES="unit regress isolation tap" bash "$src/test/run.sh"
}

# build_packages MAJOR: the Debian packages for MAJOR, built in its root with
# debian/build.sh, copied to IDEM_DEB_OUT/<release>/.
build_packages() {
    local major=$1 release root src=/tmp/idempotency-deb/src out
    release=$(release_of_major "$major") || return 1
    root=$(dev_root "$major") || return 1
    out=$IDEM_DEB_OUT/$release
    rm -rf "$root/tmp/idempotency-deb" "$root/tmp/idempotency-debs" "$out" &&
        copy_source "$root$src" &&
        in_root_cached "$root" bash "$src/debian/build.sh" /tmp/idempotency-debs &&
        mkdir -p "$out" && cp "$root"/tmp/idempotency-debs/*.deb "$out/" &&
        ls "$out"/postgresql-"$major"-idempotency_*.deb "$out"/idem-relay_*.deb
}

# upgrade_in_root NEW OLD TESTS: the TAP tests of test/tap/major_upgrade/
# named in TESTS (e.g. "pg_upgrade dump_restore") from OLD to NEW, in a root
# holding both majors, the extension built and installed for each.
upgrade_in_root() {
    local new=$1 old=$2 tests=$3 root src=/tmp/idempotency-src old_src=/tmp/idempotency-old
    root=$(upgrade_root "$new" "$old") || return 1
    copy_source "$root$old_src" || return 1
    log "building and installing the extension for PostgreSQL $old"
    in_root_cached "$root" make -C "$old_src" -s -j2 \
        PG_CONFIG="/usr/lib/postgresql/$old/bin/pg_config" all install || return 1
    copy_source "$root$src" || return 1
    in_root_cached "$root" PG_CONFIG="/usr/lib/postgresql/$new/bin/pg_config" \
        IDEM_SUITES=tap IDEM_TAP_FILES="$(printf 'test/tap/major_upgrade/%s.pl ' $tests)" \
        IDEM_UPGRADE_FROM="/usr/lib/postgresql/$old" bash "$src/test/run.sh"
    local status=$?
    umount_root "$root"
    return $status
}
