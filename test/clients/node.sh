#!/usr/bin/env bash
# The Node.js client's tests (clients/node, `node --test`) against a
# throwaway cluster: `npm ci` of its development dependencies (Express,
# Fastify, TypeScript), then every test file, each on its own keys. Exits
# non-zero on any failure. Needs the extension installed (make install).
# Settings: CLIENTS_NODE_PORT (54471, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a test fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../examples/lib/example.sh"
package=$(cd "$here/../../clients/node" && pwd)

example_start clients-node "${CLIENTS_NODE_PORT:-54471}" clients
log "clients/node: npm ci"
example_run timeout 300 npm ci --prefix "$package" --no-audit --no-fund --loglevel=error \
    >"$EXAMPLE_DIR/npm.log" 2>&1 || { cat "$EXAMPLE_DIR/npm.log" >&2; example_fail "npm ci failed"; }
log "clients/node: node --test"
(cd "$package" && example_run timeout 300 npm test --silent) || example_fail "clients/node tests failed"
