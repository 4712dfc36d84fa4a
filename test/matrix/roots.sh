# Debian roots for the PostgreSQL majors the host does not have, made with
# debootstrap once and kept under one fixed folder outside the repository,
# so that later runs (and CI on the same machine) reuse them.
#
#   IDEM_MATRIX_CACHE/<release>/base   the pristine minimal system
#   IDEM_MATRIX_CACHE/<release>/dev    base + compiler + PostgreSQL <major>
#   IDEM_MATRIX_CACHE/<release>/debs   downloaded packages, kept
#
# Sourced after test/lib/common.sh. Every function runs as root.

IDEM_MATRIX_CACHE=${IDEM_MATRIX_CACHE:-/var/cache/idempotency/matrix}
IDEM_MIRROR=${IDEM_MIRROR:-http://deb.debian.org/debian}

# The Debian release whose archive carries a PostgreSQL major.
release_of_major() {
    case $1 in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo forky ;;
        *) echo "no Debian release known for PostgreSQL $1" >&2; return 1 ;;
    esac
}

# Debian 12's debootstrap has no script for forky: it is built like sid.
debootstrap_script() {
    local script=/usr/share/debootstrap/scripts/$1
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
    echo "$script"
}

# mount_root DIR: what PostgreSQL and apt need from the kernel. /dev is a
# slave copy so that unmounting it here never reaches the host's /dev.
mount_root() {
    local root=$1
    mountpoint -q "$root/proc" || mount -t proc proc "$root/proc" || return 1
    if ! mountpoint -q "$root/dev"; then
        mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev" || return 1
    fi
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

umount_root() {
    local root=$1
    mountpoint -q "$root/dev" && umount -R "$root/dev"
    mountpoint -q "$root/proc" && umount "$root/proc"
    return 0
}

# remove_root DIR: deletes a root, never while anything is mounted inside.
remove_root() {
    local root=$1
    [ -d "$root" ] || return 0
    umount_root "$root"
    if findmnt -rn -o TARGET | grep -q "^$root/"; then
        echo "$root still has mounts: not removing it" >&2
        return 1
    fi
    rm -rf --one-file-system "$root"
}

# in_root DIR COMMAND...: runs a command inside a mounted root with a plain
# environment.
in_root() {
    local root=$1; shift
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

# apt_in_root DIR ARGS...: apt-get inside a root, keeping the downloaded
# packages beside the root for the next one made. The testing archive's Release file may be past its Valid-Until.
apt_in_root() {
    local root=$1 debs; shift
    debs=$(dirname "$root")/debs
    mkdir -p "$debs/partial" "$root/var/cache/apt/archives"
    mountpoint -q "$root/var/cache/apt/archives" ||
        mount --bind "$debs" "$root/var/cache/apt/archives" || return 1
    in_root "$root" apt-get -o Acquire::Check-Valid-Until=false -o APT::Keep-Downloaded-Packages=true \
        -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confold -qq "$@"
    local status=$?
    umount "$root/var/cache/apt/archives"
    return $status
}

# base_root RELEASE: the pristine minimal system, made once.
base_root() {
    local release=$1 dir=$IDEM_MATRIX_CACHE/$1/base
    if [ ! -f "$dir/.idem-complete" ]; then
        log "debootstrap $release (once; kept in $dir)"
        remove_root "$dir" || return 1
        mkdir -p "$IDEM_MATRIX_CACHE/$release/debs"
        debootstrap --variant=minbase --cache-dir="$IDEM_MATRIX_CACHE/$release/debs" \
            "$release" "$dir" "$IDEM_MIRROR" "$(debootstrap_script "$release")" \
            >"$IDEM_MATRIX_CACHE/$release/debootstrap.log" 2>&1 || {
            tail -n 20 "$IDEM_MATRIX_CACHE/$release/debootstrap.log" >&2
            return 1
        }
        echo "deb $IDEM_MIRROR $release main" >"$dir/etc/apt/sources.list"
        # Packages are kept in the shared cache, not cleaned after install.
        rm -f "$dir/etc/apt/apt.conf.d/docker-clean"
        # Installing a server package must neither start a service nor make
        # a cluster: the host's network is shared, and tests make their own.
        printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
        chmod +x "$dir/usr/sbin/policy-rc.d"
        mkdir -p "$dir/etc/postgresql-common"
        echo "create_main_cluster = false" >"$dir/etc/postgresql-common/createcluster.conf"
        touch "$dir/.idem-complete"
    fi
    echo "$dir"
}

# prepared_root DIR RELEASE OLD_RELEASE PACKAGES...: a copy of RELEASE's base
# system with PACKAGES installed, made once and brought up to date when the
# list changes. With an OLD_RELEASE (else ""), that release's archive is
# added at a low priority: it gives only what RELEASE lacks (an older
# PostgreSQL major and its libraries). Leaves the root mounted.
prepared_root() {
    local dir=$1 release=$2 old_release=$3 base wanted; shift 3
    wanted=$(echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort | tr '\n' ' ')
    mkdir -p "$IDEM_MATRIX_CACHE"
    exec 9>"$IDEM_MATRIX_CACHE/$release.lock"
    flock 9
    if [ ! -f "$dir/.idem-complete" ]; then
        base=$(base_root "$release") || return 1
        remove_root "$dir" || return 1
        log "copying the $release base to $dir"
        cp -a "$base" "$dir" && rm -f "$dir/.idem-complete" || return 1
        if [ -n "$old_release" ]; then
            echo "deb $IDEM_MIRROR $old_release main" >"$dir/etc/apt/sources.list.d/$old_release.list"
            printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$old_release" \
                >"$dir/etc/apt/preferences.d/$old_release"
        fi
        touch "$dir/.idem-complete"
    fi
    mount_root "$dir" || return 1
    if [ "$(cat "$dir/.idem-packages" 2>/dev/null)" != "$wanted" ]; then
        log "installing ${wanted% } in $dir"
        apt_in_root "$dir" update &&
            apt_in_root "$dir" install -y --no-install-recommends $wanted >/dev/null || return 1
        echo "$wanted" >"$dir/.idem-packages"
    fi
    echo "$dir"
}

# dev_root MAJOR: the root of MAJOR's release with everything the suites
# and the package build need (the same list `make test` installs on the host).
dev_root() {
    local major=$1 release
    release=$(release_of_major "$major") || return 1
    prepared_root "$IDEM_MATRIX_CACHE/$release/dev" "$release" "" \
        $(idem_packages_for "$major" core packaging) ccache
}

# upgrade_root NEW OLD: NEW's release with the older major OLD installed
# beside NEW from OLD's release, for pg_upgrade between them.
upgrade_root() {
    local new=$1 old=$2 release old_release
    release=$(release_of_major "$new") && old_release=$(release_of_major "$old") || return 1
    prepared_root "$IDEM_MATRIX_CACHE/$release/upgrade-$old" "$release" "$old_release" \
        $(idem_packages_for "$new" core) "postgresql-$old postgresql-server-dev-$old" ccache
}
