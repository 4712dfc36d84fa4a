#!/usr/bin/env bash
# The SQL edition as a managed service's user installs it (docs/managed-postgres.md):
# a cluster without shared_preload_libraries, a role without superuser that
# owns schema idempotency and runs the plain script with psql. Then the
# README's examples that run as its roles (the first idempotent call, the
# three patterns, the outbox snippet) run there and against the C++
# extension on a cluster of its own, and their answers must be the same
# (times masked: tokens and ids are the same, both sequences start at 1).
#
# Run as root after `make install` (make test does both). Ports:
# IDEM_SQL_INSTALL_PORT (54720) and the next one.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/test/lib/common.sh"

port=${IDEM_SQL_INSTALL_PORT:-54720}
bindir=$(pg_bindir)
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$root/idempotency.control")
dir=$(mktemp -d /tmp/idempotency-sql-install.XXXXXX) || exit 1
chown "$IDEM_OS_USER" "$dir"
trap 'stop_cluster "$dir/sql"; stop_cluster "$dir/cpp"; rm -rf "$dir"' EXIT

fail() { echo "sql edition install: $*" >&2; exit 1; }
psql_as() {  # psql_as CLUSTER PORT ROLE [psql args...]
    local cluster=$1 p=$2 role=$3; shift 3
    as_pg "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/$cluster" -p "$p" -U "$role" -d app "$@"
}

bash "$root/src/sql_edition/build.sh" "$version" "$dir/script" || fail "the script does not build"
chmod -R a+rX "$dir/script"
start_cluster "$dir/sql" "$port" "shared_preload_libraries = ''" || fail "no cluster"
start_cluster "$dir/cpp" "$((port + 1))" "idempotency.worker_enabled = off" || fail "no cluster"

# The SQL edition: the service's administrator, a role without superuser
# that may create roles and owns the database, makes the role that owns the
# schema, as the install's step 2 says.
psql_as sql "$port" postgres -d postgres -c 'CREATE ROLE admin LOGIN NOSUPERUSER CREATEROLE' \
    -c 'CREATE DATABASE app OWNER admin' || fail "no administrator"
psql_as sql "$port" admin -c 'CREATE ROLE idem_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE' \
    -c 'GRANT idem_owner TO CURRENT_USER' \
    -c 'CREATE SCHEMA idempotency AUTHORIZATION idem_owner' || fail "no owner and schema (step 2)"
[ "$(psql_as sql "$port" postgres -At -c 'SHOW shared_preload_libraries')" = "" ] ||
    fail "the cluster preloads a library"
[ "$(psql_as sql "$port" idem_owner -At -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user')" = f ] ||
    fail "the owner is a superuser"
psql_as sql "$port" idem_owner -f "$dir/script/idempotency-sql--$version.sql" >"$dir/install.log" 2>&1 ||
    { cat "$dir/install.log"; fail "the plain script did not install as a role without superuser"; }
[ "$(psql_as sql "$port" idem_owner -At -c "SELECT count(*) FROM pg_extension WHERE extname LIKE 'idempotency%'")" = 0 ] ||
    fail "an extension was created"

# The C++ extension, as the README installs it.
psql_as cpp "$((port + 1))" postgres -d postgres -c 'CREATE DATABASE app' || fail "no database"
psql_as cpp "$((port + 1))" postgres -c 'CREATE EXTENSION idempotency' || fail "no extension"

# The README's roles, given their rights by each edition's owner.
for edition in "sql $port idem_owner" "cpp $((port + 1)) postgres"; do
    set -- $edition
    psql_as "$1" "$2" postgres -c 'CREATE ROLE app LOGIN' -c 'CREATE ROLE relay LOGIN' \
        -c 'CREATE ROLE monitoring LOGIN' || fail "no roles"
    psql_as "$1" "$2" "$3" -c "SELECT idempotency.grant_application('app')" \
        -c "SELECT idempotency.grant_relay('relay', topics => '{order.paid}')" \
        -c "SELECT idempotency.grant_monitoring('monitoring')" >/dev/null || fail "no grants ($1)"
done

# The README's blocks but its install, each as its role, in both editions.
mkdir -p "$dir/blocks"
list=$(python3 "$root/test/docs/extract.py" "$root/README.md" "$dir/blocks") || fail "no blocks"
chmod -R a+rX "$dir/blocks"
mask() {
    sed -E -e 's/[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+[+-][0-9]{2}/<time>/g' \
        -e 's/[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]+/<interval>/g' "$1"
}
blocks=0
while IFS=$'\t' read -r file line role; do
    case $file in *.sql) ;; *) continue ;; esac
    grep -q 'CREATE EXTENSION' "$file" && continue
    [ "$role" = - ] && continue
    for edition in "sql $port" "cpp $((port + 1))"; do
        set -- $edition
        psql_as "$1" "$2" "$role" -a -A -f "$file" >"$dir/$1.out" 2>&1 ||
            { cat "$dir/$1.out"; fail "README.md:$line failed on the $1 edition"; }
    done
    if ! diff <(mask "$dir/cpp.out") <(mask "$dir/sql.out") >"$dir/diff"; then
        cat "$dir/diff"
        fail "README.md:$line answers differently on the SQL edition"
    fi
    blocks=$((blocks + 1))
done <<<"$list"
[ "$blocks" -ge 5 ] || fail "only $blocks blocks of the README ran"

# expire_on_disconnect run by the owner, who cannot read another role's
# backend_start: a claim whose session is alive stays held; once the session
# has gone it is expired. Before, every holder looked gone.
psql_as sql "$port" app -c "SELECT 1 FROM idempotency.idem_claim('held-live', lease => '5 min')" \
    -c 'SELECT pg_sleep(60)' >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 100); do
    [ "$(psql_as sql "$port" idem_owner -At -c "SELECT status FROM idempotency.idempotency_keys WHERE key = 'held-live'")" = PROCESSING ] && break
    sleep 0.1
done
expire_disconnected() {
    psql_as sql "$port" idem_owner -At -c 'SET idempotency.expire_on_disconnect = on' \
        -c "SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_disconnected'"
}
[ "$(expire_disconnected)" = 0 ] || fail "expire_on_disconnect expired a claim whose session is alive"
psql_as sql "$port" postgres -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'" >/dev/null
wait "$holder" 2>/dev/null
for _ in $(seq 1 100); do
    [ "$(psql_as sql "$port" idem_owner -At -c "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")" = 0 ] && break
    sleep 0.1
done
[ "$(expire_disconnected)" = 1 ] || fail "expire_on_disconnect left the claim of a session that has gone"

# The edition's update scripts (src/sql_edition/updates/): a sample update
# from this version, built as build.sh builds the real ones, runs once as
# the owner and is refused the second time (the edition is no longer at
# its starting version); the version the edition reports follows.
mkdir -p "$dir/updates"
echo "CREATE FUNCTION idempotency.sample_update() RETURNS int LANGUAGE sql AS \$\$ SELECT 1 \$\$;" \
    >"$dir/updates/$version--99.0.0.sql"
IDEM_SQL_UPDATES=$dir/updates bash "$root/src/sql_edition/build.sh" "$version" "$dir/script" ||
    fail "the sample update does not build"
chmod -R a+rX "$dir/script"
[ "$(psql_as sql "$port" idem_owner -At -c 'SELECT idempotency.sql_edition_version()')" = "$version" ] ||
    fail "the installed edition does not report $version"
psql_as sql "$port" idem_owner -f "$dir/script/idempotency-sql--$version--99.0.0.sql" >"$dir/update.log" 2>&1 ||
    { cat "$dir/update.log"; fail "the plain update script did not run as the owner"; }
[ "$(psql_as sql "$port" idem_owner -At -c 'SELECT idempotency.sql_edition_version(), idempotency.sample_update()')" = "99.0.0|1" ] ||
    fail "the update did not take the edition to 99.0.0"
if psql_as sql "$port" idem_owner -f "$dir/script/idempotency-sql--$version--99.0.0.sql" >"$dir/update.log" 2>&1 ||
    ! grep -q "this script updates the SQL edition $version; the installed one is 99.0.0" "$dir/update.log"; then
    cat "$dir/update.log"; fail "the update ran again on an edition it is not for"
fi
echo "sql edition install: installed without superuser or preload; $blocks README blocks answer as on the C++ extension; expire_on_disconnect tells a live holder from a gone one; a plain update script ran once"
