// Checks the running Next.js server (API_URL) the way a client sees it,
// then the orders table (PG* environment): prints "ok - ..." per check and
// exits non-zero on the first failure.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';

const url = process.env.API_URL;
const pool = new pg.Pool({ max: 2 });
const post = async (key, body) => {
  const start = performance.now();
  const res = await fetch(url, {
    method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, replayed: res.headers.get('idempotent-replayed') === 'true', ms: performance.now() - start };
};
const orders = async (key) => Number((await pool.query('SELECT count(*) FROM orders WHERE idempotency_key = $1', [key])).rows[0].count);
const ok = (what) => console.log(`ok - ${what}`);

const missing = await post(null, { item: 'tea' });
assert.equal(missing.status, 400);
assert.equal(missing.headers.get('content-type'), 'application/problem+json');
ok('no Idempotency-Key: 400, a problem document');

const key = `next-${randomUUID()}`;
const first = await post(key, { item: 'tea' });
assert.equal(first.status, 201, first.text);
assert.equal(first.replayed, false);
const again = await post(key, { item: 'tea' });
assert.deepEqual([again.status, again.replayed, again.text, again.headers.get('location')],
  [201, true, first.text, first.headers.get('location')]);
assert.equal(await orders(key), 1);
ok('a repeat replays status, Location and body; one order written');

assert.equal((await post(key, { item: 'coffee' })).status, 422);
ok('the key with another body: 422');

const crowd = `next-${randomUUID()}`;
const answers = await Promise.all(Array.from({ length: 30 }, () => post(crowd, '{"item": "cake"}')));
assert.deepEqual(answers.map((a) => a.status), Array(30).fill(201));
assert.equal(answers.filter((a) => !a.replayed).length, 1);
assert.ok(answers.every((a) => a.text === answers[0].text));
assert.equal(await orders(crowd), 1);
const slowest = Math.max(...answers.map((a) => a.ms));
assert.ok(slowest < 6000, `the slowest duplicate answered after ${Math.round(slowest)} ms`);
ok(`30 concurrent duplicates (wait 5 s): one order, 29 replays, the slowest after ${Math.round(slowest)} ms`);

const invalid = `next-${randomUUID()}`;
assert.equal((await post(invalid, { nothing: true })).status, 400);
const invalidAgain = await post(invalid, { nothing: true });
assert.deepEqual([invalidAgain.status, invalidAgain.replayed], [400, true]);
ok('an invalid order is a final 400, replayed');
await pool.end();
