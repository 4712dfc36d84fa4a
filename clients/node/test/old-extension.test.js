// Against a database whose extension is still 0.6.0 (the harness makes it:
// OLD_DATABASE): a client upgraded before ALTER EXTENSION ... UPDATE keeps
// working, without the answers 0.7.0 added (result_expired, steps).
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { claim } from '../src/index.js';
import { newKey } from './helpers.js';
import pg from 'pg';

const database = process.env.OLD_DATABASE;
const pool = database ? new pg.Pool({ max: 4, database }) : null;
after(() => pool?.end());

const skip = database ? false : process.env.IDEM_EDITION === 'sql'
  ? 'the SQL edition has no version before 0.7.0 to be left on' : 'OLD_DATABASE is not set';
describe('an extension not updated yet (0.6.0)', { skip }, () => {
  test('is 0.6.0', async () => {
    const { rows: [row] } = await pool.query(
      "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'");
    assert.equal(row.extversion, '0.6.0');
  });

  test('runs the work once; a duplicate gets the stored result', async () => {
    const key = newKey('old');
    let runs = 0;
    const first = await claim(pool, { key, request: { n: 1 } }, async () => { runs += 1; return { sent: 1 }; });
    assert.deepEqual(first, { outcome: 'completed', result: { sent: 1 }, replayed: false });
    const second = await claim(pool, { key, request: { n: 1 } }, async () => { runs += 1; });
    assert.deepEqual(second, { outcome: 'completed', result: { sent: 1 }, replayed: true });
    assert.equal(runs, 1);
  });
});
