#!/usr/bin/env bash
# Puts the SQL edition's scripts together from its parts:
#   OUT/idempotency_sql--VERSION.sql   the script of CREATE EXTENSION idempotency_sql
#   OUT/idempotency-sql--VERSION.sql   the plain script, for psql -f by the role that
#                                      owns (or may create) schema idempotency
# The types, tables and indexes, and the roles, views and rights, are taken
# from the C++ edition's full script, so that both editions have one schema.
# and, for each update FROM--TO.sql under src/sql_edition/updates/ (or
# the folder IDEM_SQL_UPDATES names), the edition's update scripts:
#   OUT/idempotency_sql--FROM--TO.sql  for ALTER EXTENSION idempotency_sql UPDATE
#   OUT/idempotency-sql--FROM--TO.sql  for psql -f by the edition's owner: one
#                                      transaction, refused unless the installed
#                                      edition is FROM
# each the update's statements and the new idempotency.sql_edition_version().
# Usage: build.sh VERSION OUT
set -eu
version=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
full=$here/../extension/idempotency--$version.sql
parts=$here/parts
updates=${IDEM_SQL_UPDATES:-$here/updates}
mkdir -p "$out"

# The edition's version, which its update scripts and the move to the C++
# extension (move_to_cpp.sql) check.
version_function() {
    echo "CREATE OR REPLACE FUNCTION idempotency.sql_edition_version() RETURNS pg_catalog.text"
    echo "LANGUAGE sql IMMUTABLE AS \$\$ SELECT '$1'::pg_catalog.text \$\$;"
    echo "REVOKE ALL ON FUNCTION idempotency.sql_edition_version() FROM PUBLIC;"
}

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
    version_function "$version"
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

for update in "$updates"/*--*.sql; do
    [ -f "$update" ] || continue
    name=$(basename "$update" .sql)
    from=${name%%--*}
    to=${name#*--}
    {
        echo "-- idempotency, SQL edition: the update from $from to $to (ALTER EXTENSION idempotency_sql UPDATE)."
        echo "-- Put together by src/sql_edition/build.sh from src/sql_edition/updates/$name.sql."
        echo
        echo '\echo Use "ALTER EXTENSION idempotency_sql UPDATE" to load this file. \quit'
        echo
        cat "$update"
        echo
        version_function "$to"
    } >"$out/idempotency_sql--$name.sql.tmp"
    mv "$out/idempotency_sql--$name.sql.tmp" "$out/idempotency_sql--$name.sql"
    {
        echo "-- idempotency, SQL edition: the update from $from to $to of a plain install."
        echo "-- Put together by src/sql_edition/build.sh from src/sql_edition/updates/$name.sql."
        echo "-- Run it as the edition's owner: psql -v ON_ERROR_STOP=1 -f idempotency-sql--$name.sql"
        echo
        echo 'BEGIN;'
        echo "DO \$check\$"
        echo "DECLARE"
        echo "    installed pg_catalog.text;"
        echo "BEGIN"
        echo "    IF pg_catalog.to_regprocedure('idempotency.sql_edition_version()') IS NOT NULL THEN"
        echo "        EXECUTE 'SELECT idempotency.sql_edition_version()' INTO installed;"
        echo "    END IF;"
        echo "    IF installed IS DISTINCT FROM '$from' THEN"
        echo "        RAISE EXCEPTION 'this script updates the SQL edition $from; the installed one is %',"
        echo "            COALESCE(installed, 'none') USING ERRCODE = 'feature_not_supported';"
        echo "    END IF;"
        echo "END"
        echo "\$check\$;"
        cat "$update"
        echo
        version_function "$to"
        echo 'COMMIT;'
    } >"$out/idempotency-sql--$name.sql.tmp"
    mv "$out/idempotency-sql--$name.sql.tmp" "$out/idempotency-sql--$name.sql"
done
