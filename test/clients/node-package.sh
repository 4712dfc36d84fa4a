#!/usr/bin/env bash
# The Node.js client installs the way packages are installed: the install
# commands at the top of clients/node/README.md (npm pack, then npm install
# of the tarball), run word for word in an empty folder, then an empty
# TypeScript project (strict, skipLibCheck false, NodeNext) that imports
# pg-idempotency, pg-idempotency/express and pg-idempotency/web compiles
# with tsc, the package is a copy (not a symlink into the checkout), and
# the project still compiles and loads after it was moved elsewhere.
# Needs no database. npm uses its cache first (prefer-offline) and the
# registry for what the cache lacks. Exits non-zero on any failure.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/test/lib/common.sh"
package=$root/clients/node
work=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-node-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
export npm_config_prefer_offline=true npm_config_audit=false npm_config_fund=false npm_config_loglevel=error
fail() { echo "not ok - $*" >&2; exit 1; }

# The install commands name the tarball of this version, here and in the docs.
version=$(node -p "require('$package/package.json').version")
for page in "$package/README.md" "$root/docs/clients-node.md"; do
    grep -q "npm install ./pg-idempotency-$version.tgz" "$page" || fail "${page#$root/} does not install pg-idempotency-$version.tgz"
done

# The README's first shell block, with its checkout path set to this one.
block=$(awk '/^```sh$/ { if (++n == 1) { inside = 1; next } } /^```$/ { inside = 0 } inside' "$package/README.md")
[ -n "$block" ] || fail "clients/node/README.md has no sh block"
grep -q '^IDEMPOTENCY=' <<<"$block" || fail "the install block does not start from IDEMPOTENCY=<checkout>"
app=$work/app
mkdir -p "$app" && cd "$app" || exit 1
echo '{ "name": "first-hour", "private": true, "type": "module" }' >package.json
log "node-package: the README's install block"
sed "s|^IDEMPOTENCY=.*|IDEMPOTENCY='$root'|" <<<"$block" >"$work/install.sh"
cat "$work/install.sh" >&2
timeout 300 bash -e "$work/install.sh" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "the install block failed"; }
[ -d node_modules/pg-idempotency ] && [ ! -L node_modules/pg-idempotency ] ||
    fail "node_modules/pg-idempotency is not a folder of its own: $(ls -ld node_modules/pg-idempotency 2>&1)"
echo "ok - the README's install block installs a copy of the package"

# The versions the client is tested with (its lock file), so that the cache serves them.
version() { node -e "const l=require('$package/package-lock.json');console.log(l.packages['node_modules/$1'].version)"; }
log "node-package: an empty strict TypeScript project"
timeout 300 npm install --save-dev "express@$(version express)" "@types/express@$(version @types/express)" \
    "@types/pg@$(version @types/pg)" "@types/node@$(version @types/node)" "typescript@$(version typescript)" \
    >"$work/npm.log" 2>&1 || { cat "$work/npm.log" >&2; fail "npm install of the TypeScript project failed"; }
cat >tsconfig.json <<'JSON'
{
  "compilerOptions": {
    "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
    "strict": true, "skipLibCheck": false, "outDir": "dist", "types": ["node"]
  },
  "files": ["index.ts"]
}
JSON
cat >index.ts <<'TS'
import express from 'express';
import pg from 'pg';
import { claim, shutdown, type ClaimResult } from 'pg-idempotency';
import { idempotency } from 'pg-idempotency/express';
import { idempotencyOf, withIdempotency } from 'pg-idempotency/web';

const pool = new pg.Pool({ max: 10 });
const app = express();
app.post('/orders', express.json(), idempotency({ pool, wait: 5 }), (req, res) => {
  res.status(201).json({ key: req.idempotency?.key });
});
export const POST = withIdempotency({ pool }, async (request: Request) =>
  Response.json({ key: idempotencyOf(request)?.key }, { status: 201 }));
export async function once(key: string): Promise<ClaimResult<{ sent: boolean }>> {
  return claim(pool, { key, wait: 5 }, async () => ({ sent: true }));
}
export const stop = () => shutdown(pool, { timeout: 5 });
console.log(typeof app, typeof POST, typeof once, typeof stop);
TS
compile() { timeout 120 node node_modules/typescript/bin/tsc -p . >"$work/tsc.log" 2>&1 || { cat "$work/tsc.log" >&2; fail "tsc failed $1"; }; }
compile "in the new project"
echo "ok - a strict TypeScript project (skipLibCheck false) compiles against the tarball"

moved=$work/moved
mv "$app" "$moved" && cd "$moved" || exit 1
rm -rf dist
compile "after the project was moved"
out=$(timeout 60 node dist/index.js 2>&1) || fail "the compiled project does not load: $out"
[ "$out" = "function function function function" ] || fail "unexpected output: $out"
echo "ok - moved elsewhere, it still compiles and loads"
echo "node-package: all checks passed"
