#!/usr/bin/env bash
# The next-app-router example end to end: a throwaway cluster, the client
# packed (npm pack) and installed from its tarball with Next.js 16, a real
# production build (`next build`, about 20 s on two cores) and `next start`
# on loopback, then scenario.js: no key (400), a replay byte for byte, the
# key reused (422), 30 concurrent duplicates (one order, the others wait
# and get the replay), a final 400 replayed; and the orders table. The
# build runs on a copy of the example in the cluster's folder, so nothing
# is written beside the sources. Exits non-zero on any failure.
# Needs the extension installed (make install) and the npm registry (or
# npm's cache) for Next.js.
# Settings: NEXT_EXAMPLE_PORT (54462, names the cluster's socket), EXAMPLE_KEEP=1.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/example.sh"

example_start next-app-router "${NEXT_EXAMPLE_PORT:-54462}" shop
example_psql -f "$here/schema.sql" >/dev/null || example_fail "schema.sql failed"
app=$EXAMPLE_DIR/app
mkdir -p "$app" && cp -r "$here/app" "$here/lib" "$here/package.json" "$here/next.config.mjs" "$here/scenario.js" "$app/"
export NEXT_TELEMETRY_DISABLED=1

log "next-app-router: npm pack the client, npm install"
(cd "$app" && example_run timeout 120 npm pack "$here/../../clients/node" --pack-destination "$app" >"$EXAMPLE_DIR/pack.log" 2>&1 &&
    mv "$app"/pg-idempotency-*.tgz "$app/pg-idempotency.tgz") || { cat "$EXAMPLE_DIR/pack.log" >&2; example_fail "npm pack failed"; }
(cd "$app" && example_run timeout 300 npm install --prefer-offline --no-audit --no-fund --loglevel=error) \
    >"$EXAMPLE_DIR/npm.log" 2>&1 || { cat "$EXAMPLE_DIR/npm.log" >&2; example_fail "npm install failed"; }

log "next-app-router: next build"
(cd "$app" && example_run timeout 300 node_modules/.bin/next build) >"$EXAMPLE_DIR/build.log" 2>&1 ||
    { cat "$EXAMPLE_DIR/build.log" >&2; example_fail "next build failed"; }

# A free port on loopback for next start (it takes no port 0).
port=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
log "next-app-router: next start on 127.0.0.1:$port"
cd "$app" || example_fail "no $app"
example_bg "$EXAMPLE_DIR/next.log" node_modules/.bin/next start -H 127.0.0.1 -p "$port"
next_pid=${EXAMPLE_PIDS[-1]}
example_wait_for 60 grep -q -i ready "$EXAMPLE_DIR/next.log" || example_fail "next start did not become ready"

API_URL="http://127.0.0.1:$port/api/orders" example_run timeout 120 node scenario.js
status=$?
example_stop "$next_pid" 10 >/dev/null 2>&1
[ "$status" -eq 0 ] || example_fail "next-app-router checks failed"
echo "next-app-router: all checks passed"
