# Shared shell helpers of the test, demo and benchmark commands.
# They run as root: packages and `make install` need it; every PostgreSQL
# process runs as the unprivileged `postgres` OS user, as the server requires.

IDEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IDEM_OS_USER=${IDEM_OS_USER:-postgres}

# The Debian packages a group of suites needs against PostgreSQL MAJOR:
#   core       build (idem-relay with its NATS and RabbitMQ sinks), unit,
#              pg_regress, isolation and TAP suites
#   harnesses  the host-only harnesses (stress, chaos, relay, brokers,
#              examples, bench)
#   packaging  `make deb` (the PostgreSQL Debian build tooling)
#   roots      the host tools `make test-matrix` and `make deb` make their
#              Debian roots with
idem_packages_for() {
    local major=$1 group; shift
    for group in "$@"; do
        case $group in
            core) echo "postgresql-$major postgresql-server-dev-$major libpq-dev libipc-run-perl
                g++ make cmake pkg-config libgtest-dev libcurl4-openssl-dev libnats-dev
                librabbitmq-dev $(idem_third_party_packages "$major")" ;;
            harnesses) echo "postgresql-contrib python3 python3-psycopg2 nodejs gnuplot-nox
                python3-psycopg python3-psycopg-pool python3-venv python3-pip python3-fastapi
                python3-httpx python3-pytest python3-uvicorn curl prometheus prometheus-postgres-exporter
                python3-matplotlib nats-server rabbitmq-server python3-pika pgbouncer
                python3-flask python3-django openssl golang-go golang-github-lib-pq-dev
                golang-github-jackc-pgx-v4-dev" ;;
            packaging) echo "postgresql-server-dev-all debhelper build-essential fakeroot" ;;
            roots) echo "debootstrap" ;;
        esac
    done
}

# Debian's packages of other projects' extensions that TAP tests use, for
# the host's major (15) only: pg_cron, which runs the SQL edition's
# housekeeping in test/tap/035_sql_edition_pg_cron.pl, and pg_repack, which
# test/tap/036_repack.pl runs under traffic. The matrix's other majors have
# none and those tests skip there.
idem_third_party_packages() {
    [ "$1" = 15 ] && echo "postgresql-$1-cron postgresql-$1-repack"
    return 0
}

# Whether those tests must run rather than skip: the PostgreSQL under test
# is the Debian package's, for which the package list above has them (a
# relocated copy, named by PG_CONFIG, may lack them).
idem_third_party_required() {
    [ -n "$(idem_third_party_packages "$(idem_major)")" ] &&
        dpkg -S "$(pg_config_path)" >/dev/null 2>&1
}

log() { printf '== %s\n' "$*" >&2; }

# Installs whatever of IDEM_PACKAGES is missing.
ensure_packages() {
    local missing=() pkg
    for pkg in $IDEM_PACKAGES; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    # Debian's nodejs comes without npm; other builds of it bundle npm.
    case " $IDEM_PACKAGES " in
        *" nodejs "*) command -v npm >/dev/null 2>&1 || missing+=(npm) ;;
    esac
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing packages (${missing[*]}) and not root: install them first" >&2
        return 1
    fi
    # The broker and pooler packages would start system services (RabbitMQ
    # on 5672, NATS on 4222, PgBouncer on 6432); the harnesses run their
    # own, so packages installed here start none and those services stay
    # disabled.
    local policy=/usr/sbin/policy-rc.d made_policy= status
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# idempotency tests: no service starts while they install packages\nexit 101\n' >"$policy" &&
            chmod 755 "$policy" && made_policy=yes
    fi
    apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    status=$?
    [ -n "$made_policy" ] && rm -f "$policy"
    if [ -d /run/systemd/system ]; then
        for pkg in "${missing[@]}"; do
            case $pkg in
                rabbitmq-server | nats-server | pgbouncer)
                    systemctl disable --now "$pkg" >/dev/null 2>&1 &&
                        log "$pkg: its system service disabled (the tests run their own)" ;;
            esac
        done
    fi
    return "$status"
}

# The pg_config of the newest installed PostgreSQL, unless PG_CONFIG is set.
pg_config_path() {
    if [ -n "${PG_CONFIG:-}" ]; then echo "$PG_CONFIG"; return; fi
    ls /usr/lib/postgresql/*/bin/pg_config 2>/dev/null | sort -V | tail -n 1
}

pg_bindir() { "$(pg_config_path)" --bindir; }

# The major the tests run against: pg_config_path's, or Debian 12's (15)
# before any PostgreSQL is installed.
idem_major() {
    local version
    version=$("$(pg_config_path)" --version 2>/dev/null) || { echo 15; return; }
    version=${version#PostgreSQL }
    echo "${version%%.*}"
}

# The suites test/run.sh runs; the version matrix runs all but the harnesses.
IDEM_SUITES=${IDEM_SUITES:-unit regress isolation tap harnesses}
case " $IDEM_SUITES " in
    *" harnesses "*) IDEM_PACKAGES=$(idem_packages_for "$(idem_major)" core harnesses) ;;
    *) IDEM_PACKAGES=$(idem_packages_for "$(idem_major)" core) ;;
esac

build_and_install() {
    log "building and installing the extension"
    make -C "$IDEM_ROOT" -s PG_CONFIG="$(pg_config_path)" &&
        make -C "$IDEM_ROOT" -s PG_CONFIG="$(pg_config_path)" install
}

# Runs a command as the unprivileged OS user (directly when we are that user).
as_pg() {
    if [ "$(id -un)" = "$IDEM_OS_USER" ]; then "$@"; else runuser -u "$IDEM_OS_USER" -- "$@"; fi
}

# Copies the source tree (without .git and build products) to a new folder
# under $TMPDIR (default /tmp) that the OS user owns, since the suites write
# next to their inputs.
stage_tree() {
    local dest
    dest=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-test.XXXXXX")
    tar -C "$IDEM_ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude=./build \
        --exclude=./results --exclude=./output_iso --exclude='./tmp_*' -cf - . | tar -C "$dest" -xf -
    chown -R "$IDEM_OS_USER" "$dest"
    echo "$dest"
}

# start_cluster DIR PORT [setting ...]: a throwaway cluster listening only on
# a Unix socket in DIR, with the library preloaded. Settings are lines of
# postgresql.conf.
start_cluster() {
    local dir=$1 port=$2; shift 2
    local bindir; bindir=$(pg_bindir)
    mkdir -p "$dir" && chown "$IDEM_OS_USER" "$dir"
    as_pg "$bindir/initdb" -D "$dir/data" -A trust -E UTF8 --locale=C.UTF-8 -U postgres >/dev/null ||
        return 1
    {
        echo "shared_preload_libraries = 'idempotency'"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$dir'"
        echo "port = $port"
        printf '%s\n' "$@"
    } >>"$dir/data/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}

stop_cluster() {
    local dir=$1
    [ -d "$dir/data" ] || return 0
    as_pg "$(pg_bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
}
