// Shared by the tests: a pool on the cluster the harness started (PG*
// environment), fresh keys, and waiting for a condition.
import { randomUUID } from 'node:crypto';
import pg from 'pg';

export function newPool(settings = {}, poolOptions = {}) {
  // Quick retries for the tests: the first backoff is 50 to 100 ms.
  const options = Object.entries({ 'idempotency.retry_base_delay': '100ms', ...settings })
    .map(([name, value]) => `-c ${name}=${value}`).join(' ');
  return new pg.Pool({ max: 20, options, ...poolOptions });
}

export const newKey = (prefix = 'key') => `${prefix}-${randomUUID()}`;

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Polls fn() every 50 ms until it returns a truthy value; fails after `seconds`.
export async function waitFor(what, fn, seconds = 20) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

export async function keyRow(pool, key, scope = 'default') {
  const { rows: [row] } = await pool.query(
    'SELECT status::text, attempts, token::text FROM idempotency.idem_get($1, $2)', [key, scope]);
  return row?.status ? row : null;
}

// The superuser, to read the extension's tables (the application role may
// only call its functions).
export function adminPool() {
  return new pg.Pool({ max: 2, user: process.env.PGADMIN_USER ?? 'postgres' });
}

// What the purge leaves of a finished key once its result's retention has
// passed: its tombstone, made as the purge makes it (docs/keys.md, the
// digest and the fingerprint's prefix in SQL), for this key alone so that
// no other test's keys are touched.
export async function expireResult(key, scope = 'default') {
  const admin = adminPool();
  try {
    const { rowCount } = await admin.query(`
      WITH gone AS (DELETE FROM idempotency.idempotency_keys WHERE scope = $1 AND key = $2
                    RETURNING scope, key, status, fingerprint)
      INSERT INTO idempotency.key_tombstones (key_digest, forget_at, fingerprint, status)
      SELECT encode(substr(sha256(convert_to(scope, 'UTF8') || '\\x00'::bytea || convert_to(key, 'UTF8')), 1, 16), 'hex')::uuid,
             now() + interval '1 day', ('x' || encode(substr(fingerprint, 1, 4), 'hex'))::bit(32)::int4, status
        FROM gone`, [scope, key]);
    if (rowCount !== 1) throw new Error(`no finished key ${scope}/${key} to expire`);
  } finally {
    await admin.end();
  }
}
