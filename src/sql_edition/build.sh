#!/usr/bin/env bash
# Puts the SQL edition's scripts together from its parts:
#   OUT/idempotency_sql--VERSION.sql   the script of CREATE EXTENSION idempotency_sql
#   OUT/idempotency-sql--VERSION.sql   the plain script, for psql -f by the role that
#                                      owns (or may create) schema idempotency
# The types, tables and indexes, and the roles, views and rights, are taken
# from the C++ edition's full script, so that both editions have one schema.
# Usage: build.sh VERSION OUT
set -eu
version=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
full=$here/../extension/idempotency--$version.sql
parts=$here/parts
mkdir -p "$out"

# section FROM TO: the lines of the C++ script from the section header FROM
# up to (not including) the section header TO.
section() {
    awk -v from="$1" -v to="$2" '
        /^-- -+ / { name = $0; sub(/^-- -+ /, "", name)
                    if (name == from) on = 1; else if (name == to) on = 0 }
        on' "$full"
}

body() {
    section types "key functions"
    # The edition's version, which its update scripts and the move to the
    # C++ extension (move_to_cpp.sql) check.
    echo "CREATE FUNCTION idempotency.sql_edition_version() RETURNS pg_catalog.text"
    echo "LANGUAGE sql IMMUTABLE AS \$\$ SELECT '$version'::pg_catalog.text \$\$;"
    echo
    for part in arguments tombstones keys steps inbox_locks outbox counts_maintenance; do
        cat "$parts/$part.sql"
        echo
    done
    section roles backups
}

{
    echo "-- idempotency, SQL edition $version: the script of CREATE EXTENSION idempotency_sql."
    echo "-- Put together by src/sql_edition/build.sh from src/sql_edition/parts/."
    echo
    echo '\echo Use "CREATE EXTENSION idempotency_sql" to load this file. \quit'
    echo
    body
    section backups ""
} >"$out/idempotency_sql--$version.sql.tmp"
mv "$out/idempotency_sql--$version.sql.tmp" "$out/idempotency_sql--$version.sql"

{
    echo "-- idempotency, SQL edition $version: the plain install script."
    echo "-- Put together by src/sql_edition/build.sh from src/sql_edition/parts/."
    echo "--"
    echo "-- Run it as the role that will own the edition (no superuser, no"
    echo "-- preload): psql -v ON_ERROR_STOP=1 -f idempotency-sql--$version.sql"
    echo "-- See docs/managed-postgres.md."
    echo
    echo 'BEGIN;'
    cat "$parts/plain_header.sql"
    echo
    body
    echo 'COMMIT;'
} >"$out/idempotency-sql--$version.sql.tmp"
mv "$out/idempotency-sql--$version.sql.tmp" "$out/idempotency-sql--$version.sql"
