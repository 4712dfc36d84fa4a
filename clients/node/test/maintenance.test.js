// startMaintenance: idem_maintenance() on an interval, the SQL edition's
// stand-in for the C++ extension's background workers. Against the SQL
// edition (IDEM_EDITION=sql) nothing else expires a lease that nobody
// claims again: the key left PROCESSING is made FAILED_RETRYABLE by these
// calls alone. The superuser calls it (the application role may not).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { startMaintenance } from '../src/index.js';
import { adminPool, keyRow, newKey, newPool, sleep, waitFor } from './helpers.js';

const pool = newPool();
const admin = adminPool();
after(() => Promise.all([pool.end(), admin.end()]));

test('passes on an interval expire a lease nobody claims again, and stop ends them', async () => {
  const key = newKey('sweep');
  await pool.query("SELECT idempotency.idem_claim($1, lease => interval '200 milliseconds')", [key]);
  const passes = [];
  const sweeps = startMaintenance(admin, { intervalMs: 100, onPass: (tasks) => passes.push(tasks) });
  try {
    const row = await waitFor('the expired lease', async () => {
      const found = await keyRow(pool, key);
      return found?.status === 'FAILED_RETRYABLE' && found;
    });
    assert.equal(row.attempts, 1);
    // With the C++ extension its worker may expire the lease before the
    // first pass has ended: the pass is waited for, not assumed.
    await waitFor('a pass', async () => passes.length >= 1);
    const tasks = passes[0].map((t) => t.task);
    assert.ok(tasks.includes('expire_leases') && tasks.includes('purge_keys'), tasks.join(', '));
  } finally {
    await sweeps.stop();
  }
  const done = passes.length;
  await sleep(350);
  assert.equal(passes.length, done, 'no pass after stop()');
});

test('a failed pass is reported and the next one is still made', async () => {
  const errors = [];
  // The application role may not call idem_maintenance: every pass fails.
  const sweeps = startMaintenance(pool, { intervalMs: 50, onError: (err) => errors.push(err) });
  await waitFor('two failed passes', () => errors.length >= 2);
  await sweeps.stop();
  assert.match(errors[0].message, /permission denied/);
  assert.throws(() => startMaintenance(pool, { intervalMs: 0 }), RangeError);
});

test('an interval past what a timer holds is refused: the passes ran back to back', () => {
  for (const intervalMs of [2 ** 31, 30 * 86400 * 1000, 0, Number.NaN]) {
    assert.throws(() => startMaintenance(pool, { intervalMs }), /intervalMs must be/, String(intervalMs));
  }
});
