// The logging hooks of the middleware and of claim(): onReplay, onConflict
// (409), onMismatch (422) and onFenced, each called with what happened.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, describe, test } from 'node:test';
import express from 'express';
import { claim } from '../src/index.js';
import { idempotency } from '../src/express.js';
import { adminPool, newKey, newPool } from './helpers.js';

const pool = newPool();
const admin = adminPool();
after(async () => { await pool.end(); await admin.end(); });

describe('hooks', () => {
  const events = [];
  const hooks = Object.fromEntries(['onReplay', 'onConflict', 'onMismatch', 'onFenced']
    .map((name) => [name, (event) => events.push({ hook: name, ...event })]));
  const gates = new Map();   // gate name -> resolve: lets a handler answer
  const atGate = (name) => new Promise((resolve) => {
    const check = () => (gates.has(name) ? resolve() : setImmediate(check));
    check();
  });
  const app = express();
  app.use(express.json());
  app.post('/orders', idempotency({
    pool, scope: 'hooks', ...hooks,
    onReplay: (e) => { hooks.onReplay(e); throw new Error('a hook that throws changes nothing'); },
  }), async (req, res) => {
    if (req.get('x-expire')) {
      // The lease ends under this handler: the next request takes the key over.
      await admin.query(`UPDATE idempotency.idempotency_keys SET lease_until = clock_timestamp() - interval '1 second'
                           WHERE scope = 'hooks' AND key = $1`, [req.idempotency.key]);
    }
    const gate = req.get('x-gate');
    if (gate) await new Promise((resolve) => gates.set(gate, resolve));
    res.status(201).json({ attempt: req.idempotency.attempt });
  });
  const server = app.listen(0, '127.0.0.1');
  after(() => { server.close(); server.closeAllConnections(); });
  const post = async (key, body, headers = {}) => {
    if (!server.listening) await once(server, 'listening');
    const res = await fetch(`http://127.0.0.1:${server.address().port}/orders`, {
      method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers },
    });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), text: await res.text() };
  };
  const seen = (key) => events.filter((e) => e.key === key).map(({ hook, status, outcome, during }) => ({ hook, status, outcome, during }));

  test('a replay, a 409 and a 422 are heard of', async () => {
    const key = newKey('hooks');
    const first = post(key, { item: 1 }, { 'x-gate': key });
    await atGate(key);
    const conflict = await post(key, { item: 1 });
    assert.equal(conflict.status, 409);
    gates.get(key)();
    assert.equal((await first).status, 201);
    assert.equal((await post(key, { item: 1 })).status, 201);
    assert.equal((await post(key, { item: 2 })).status, 422);
    assert.deepEqual(seen(key), [
      { hook: 'onConflict', status: 409, outcome: 'in_progress', during: undefined },
      { hook: 'onReplay', status: 201, outcome: 'completed', during: undefined },
      { hook: 'onMismatch', status: 422, outcome: 'mismatch', during: undefined },
    ]);
    const conflictEvent = events.find((e) => e.key === key && e.hook === 'onConflict');
    assert.equal(conflictEvent.scope, 'hooks');
    assert.equal(String(conflictEvent.retryAfter), conflict.retryAfter);
  });

  test('a handler whose key was taken over is fenced when its response is recorded', async () => {
    const key = newKey('fenced');
    const late = post(key, { item: 1 }, { 'x-expire': '1', 'x-gate': key });
    await atGate(key);
    const taker = await post(key, { item: 1 });   // takes the expired key over and completes it
    assert.deepEqual([taker.status, JSON.parse(taker.text)], [201, { attempt: 2 }]);
    gates.get(key)();
    const answer = await late;
    assert.equal(answer.status, 201, 'the late handler\'s response is still sent');
    assert.deepEqual(seen(key), [{ hook: 'onFenced', status: undefined, outcome: undefined, during: 'record' }]);
  });
});

test('claim(): onReplay, onConflict and onFenced', async () => {
  const events = [];
  const hooks = {
    onReplay: (e) => events.push(['replay', e.outcome]),
    onConflict: (e) => events.push(['conflict', e.outcome]),
    onFenced: (e) => events.push(['fenced', e.outcome]),
  };
  const key = newKey('claim-hooks');
  await claim(pool, { key, ...hooks }, async () => {
    await claim(pool, { key, ...hooks }, async () => assert.fail('ran twice'));
    return 'done';
  });
  await claim(pool, { key, ...hooks }, async () => assert.fail('ran again'));
  const lost = newKey('claim-fenced');
  const outcome = await claim(pool, { key: lost, lease: 1, heartbeat: false, ...hooks }, async (job) => {
    await admin.query(`UPDATE idempotency.idempotency_keys SET lease_until = clock_timestamp() - interval '1 second'
                         WHERE scope = 'default' AND key = $1`, [lost]);
    await claim(pool, { key: lost }, async () => 'taken over');
    return job.complete('late');
  });
  assert.equal(outcome.outcome, 'fenced');
  assert.deepEqual(events, [['conflict', 'in_progress'], ['replay', 'completed'], ['fenced', 'fenced']]);
});
