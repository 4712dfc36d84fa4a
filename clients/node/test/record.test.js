// Recording how work ended outlives a brief loss of the database: the
// connections are cut through a proxy (test/cut-proxy.js), for a second as
// the work ends, or between the record's commit and its answer.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { once } from 'node:events';
import express from 'express';
import pg from 'pg';
import { FinalError, claim } from '../src/index.js';
import { idempotency } from '../src/express.js';
import { CutProxy } from './cut-proxy.js';
import { newKey, newPool } from './helpers.js';

const proxy = new CutProxy();
const direct = newPool();
let port;
const pools = [];
// A pool through the proxy, of the test's own: the cuts of another test
// leave it nothing.
const proxied = () => {
  const pool = new pg.Pool({ host: '127.0.0.1', port, max: 5, options: '-c idempotency.retry_base_delay=100ms' });
  pool.on('error', () => {});   // idle connections cut by the proxy
  pools.push(pool);
  return pool;
};
before(async () => { port = await proxy.listen(); });
after(async () => {
  await Promise.all(pools.map((p) => p.end()));
  await direct.end();
  await proxy.close();
});

const scope = 'node.outage';
const status = async (key) =>
  (await direct.query('SELECT status::text, attempts FROM idempotency.idem_get($1, $2)', [key, scope])).rows[0];
const options = (key) => ({ key, scope, lease: 20, heartbeat: false });

describe('a record through a lost connection', () => {
  test('the server refuses connections for a second as the work ends: complete and fail go through', async () => {
    const pool = proxied();
    let runs = 0;
    const done = await claim(pool, options(newKey()), async () => {
      runs += 1;
      proxy.cutFor(1000);
      return { sent: true };
    });
    assert.equal(done.outcome, 'completed');
    assert.equal(runs, 1);

    const key = newKey();
    const failed = await claim(pool, options(key), async () => {
      proxy.cutFor(1000);
      throw new FinalError('card declined');
    });
    assert.deepEqual([failed.outcome, failed.retryable, failed.error], ['failed', false, 'card declined']);
    assert.equal((await status(key)).status, 'FAILED_FINAL');
  });

  test('the complete commits and its answer is lost: the key holds this claim\'s record', async () => {
    const pool = proxied();
    const key = newKey();
    const done = await claim(pool, options(key), async () => {
      proxy.cutAfterNextStatement();
      return { charge: 7 };
    });
    assert.equal(done.outcome, 'completed', JSON.stringify(done));
    assert.deepEqual(done.result, { charge: 7 });
    assert.equal((await status(key)).status, 'COMPLETED');

    const failing = newKey();
    const failed = await claim(pool, options(failing), async () => {
      proxy.cutAfterNextStatement();   // BEGIN: the failure's transaction is cut before its idem_fail
      throw new Error('provider timeout');
    });
    assert.deepEqual([failed.outcome, failed.retryable], ['failed', true]);
    assert.deepEqual(await status(failing), { status: 'FAILED_RETRYABLE', attempts: 1 });
  });
});

// Transaction mode holds a connection of the pool for the request: lost
// under the handler, the request answers 500 and the key never existed.
// (The client's 'error' event was not heard, and ended the process.)
test('transaction mode: a connection lost under the handler is a 500, not the end of the process', async () => {
  await new Promise((resolve) => setTimeout(resolve, 1100));   // the refusals of the tests before have ended
  const pool = proxied();
  const app = express();
  app.post('/tx', idempotency({ pool, mode: 'transaction', scope }), async (req, res) => {
    proxy.cutFor(300);
    await new Promise((resolve) => setTimeout(resolve, 100));
    res.status(201).json({ ok: true });
  });
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    const key = newKey();
    const res = await fetch(`http://127.0.0.1:${server.address().port}/tx`, {
      method: 'POST', body: '{}', headers: { 'content-type': 'application/json', 'idempotency-key': key },
    });
    assert.equal(res.status, 500);
    assert.equal((await status(key))?.status ?? null, null);
  } finally {
    server.close();
    server.closeAllConnections();
  }
});
