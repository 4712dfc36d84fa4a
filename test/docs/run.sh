#!/usr/bin/env bash
# The doc test: every ```sql and ```sh block of README.md and docs/*.md that
# is not marked with a line `<!-- illustrative -->` before it runs, in the
# order of its page, against a throwaway cluster with the library preloaded,
# one fresh database per page, and must succeed. README.md starts from an
# empty database (it creates the extension and the roles app, relay and
# monitoring itself); every page of docs/ from one where the extension
# exists and those roles have their rights, as the README's install leaves
# it. Each block runs as the database role its page names for it (a line
# `<!-- role: NAME -->` before its fence; a block without one fails): SQL
# blocks in psql as that role (ON_ERROR_STOP); shell blocks in bash -e as
# the postgres OS user with PGUSER set to it, and PGHOST, PGPORT and
# PGDATABASE set for the page's database and the PostgreSQL binaries
# (idem-relay among them) on PATH.
# Ends with "N passed, N failed", one block a test. DOCS_PORT (54470).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/test/lib/common.sh"

port=${DOCS_PORT:-54470}
dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-docs.XXXXXX")
chmod 755 "$dir"
bindir=$(pg_bindir)
trap 'stop_cluster "$dir"; [ "$failed" -eq 0 ] && rm -rf "$dir"' EXIT
passed=0
failed=0
if ! start_cluster "$dir" "$port" "idempotency.naptime = '200ms'" \
    "idempotency.launcher_naptime = '1s'" "max_prepared_transactions = 10"; then
    cat "$dir/server.log" >&2 2>/dev/null
    echo "0 passed, 1 failed"
    exit 1
fi

run_block() {  # run_block PAGE DB FILE LINE ROLE
    local page=$1 db=$2 file=$3 line=$4 role=$5 out status
    out=$dir/out.txt
    if [ "$role" = - ]; then
        failed=$((failed + 1))
        echo "FAIL $page:$line: the block names no role (a line <!-- role: NAME --> before it)"
        return
    fi
    case $file in
    *.sql)
        as_pg "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U "$role" \
            -d "$db" -f "$file" >"$out" 2>&1 ;;
    *.sh)
        (cd "$dir/scratch" && as_pg env PGHOST="$dir" PGPORT="$port" PGDATABASE="$db" \
            PGUSER="$role" PATH="$bindir:$PATH" bash -e "$file") >"$out" 2>&1 ;;
    esac
    status=$?
    if [ "$status" -eq 0 ] && ! grep -q '^psql:.*ERROR' "$out"; then
        passed=$((passed + 1))
        echo "ok   $page:$line"
    else
        failed=$((failed + 1))
        echo "FAIL $page:$line (exit $status)"
        sed 's/^/     /' "$out" | tail -n 20
    fi
}

mkdir -p "$dir/scratch" && chown "$IDEM_OS_USER" "$dir/scratch"
for page in "$root"/README.md "$root"/docs/*.md; do
    name=$(basename "$page" .md)
    db=doc_$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_' | tr 'A-Z' 'a-z')
    blocks=$dir/blocks/$name
    list=$(python3 "$here/extract.py" "$page" "$blocks") || { failed=$((failed + 1)); continue; }
    [ -n "$list" ] || continue
    chmod -R a+rX "$dir/blocks"
    as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || { failed=$((failed + 1)); continue; }
    if [ "$name" != README ]; then
        as_pg "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d "$db" \
            -c 'CREATE EXTENSION idempotency' -f "$here/roles.sql" >/dev/null ||
            { failed=$((failed + 1)); continue; }
    fi
    while IFS=$'\t' read -r file line role; do
        run_block "${page#$root/}" "$db" "$file" "$line" "$role"
    done <<<"$list"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
