#!/usr/bin/env bash
# The Node.js client's tests (clients/node, `node --test`) against a
# throwaway cluster: `npm ci` of its development dependencies (Express,
# Fastify, TypeScript), then every test file, each on its own keys (among
# them the burst and shutdown tests, which print their timings, and the
# documentation's examples, in a database of their own). Exits
# non-zero on any failure. Needs the extension installed (make install).
# Settings: CLIENTS_NODE_PORT (54471, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a test fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../examples/lib/example.sh"
package=$(cd "$here/../../clients/node" && pwd)

example_start clients-node "${CLIENTS_NODE_PORT:-54471}" clients
# The documentation's examples run in a database of their own where `app`
# has only grant_application: what more they need, the page must grant.
example_sql -d postgres -c 'CREATE DATABASE clients_docs OWNER app' >/dev/null &&
    example_sql -d clients_docs -c "CREATE EXTENSION $(example_extension)" \
        -c "SELECT idempotency.grant_application('app')" >/dev/null ||
    example_fail "could not create the docs database"
export DOCS_DATABASE=clients_docs
# A database whose extension is not updated yet (0.6.0, served by this
# library): the client must work there as well, without what 0.7.0 added.
# (The C++ extension's versions; the SQL edition starts at 0.7.0.)
if [ "$IDEM_EDITION" = cpp ]; then
    example_sql -d postgres -c 'CREATE DATABASE clients_old OWNER app' >/dev/null &&
        example_sql -d clients_old -c "CREATE EXTENSION idempotency VERSION '0.6.0'" \
            -c "SELECT idempotency.grant_application('app')" >/dev/null ||
        example_fail "could not create the database with extension 0.6.0"
    export OLD_DATABASE=clients_old
fi
# A copy of the package (and of the docs its tests read) in this run's
# folder, with a node_modules of its own: the run against the SQL edition
# (sql_edition.sh) may go at the same time as this one.
log "clients/node: a copy, and npm ci"
copy=$EXAMPLE_DIR/tree/clients/node
mkdir -p "$copy" && (cd "$package" && tar --exclude=./node_modules -cf - .) | tar -xf - -C "$copy" &&
    cp -r "$package/../../docs" "$EXAMPLE_DIR/tree/docs" || example_fail "could not copy clients/node"
example_run timeout 300 npm ci --prefix "$copy" --no-audit --no-fund --loglevel=error \
    >"$EXAMPLE_DIR/npm.log" 2>&1 || { cat "$EXAMPLE_DIR/npm.log" >&2; example_fail "npm ci failed"; }
log "clients/node: node --test"
(cd "$copy" && example_run timeout 300 npm test --silent) || example_fail "clients/node tests failed"
