// Cancellation and shutdown are bounded. A server process under a burst
// gets SIGTERM: it exits within its graceful timeout, every handler that
// could finish in it recorded its response, and no key is left PROCESSING
// (a handler that outlives the timeout has its key given back). A client
// that disconnects stops its handler's heartbeat: the key's lease runs out
// and a retry takes it over, instead of a 409 for as long as the handler
// runs.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, describe, test } from 'node:test';
import { keyRow, newKey, newPool, waitFor } from './helpers.js';
import { figures, post, runs as runsOf, startServer, warm } from './server-process.js';

const pool = newPool();
after(() => pool.end());

for (const framework of ['express', 'web']) {
  describe(`SIGTERM during a burst (${framework})`, () => {
    const GRACE = 3;
    const scope = `shutdown.${framework}`;
    const server = startServer({
      FRAMEWORK: framework, POOL_MAX: '5', WAIT: '5', LEASE: '3', HANDLER_MS: '1500', GRACE: String(GRACE), SCOPE: scope,
    });
    after(() => server.kill());

    test('exits within its graceful timeout; no key left PROCESSING', async (t) => {
      const url = await server.url;
      await warm(url, 220);
      const keys = Array.from({ length: 20 }, () => newKey('term'));
      const stubborn = newKey('stubborn');
      const answers = [];
      for (const key of keys) for (let i = 0; i < 10; i += 1) answers.push(post(url, key, {}).then((a) => ({ ...a, key })));
      const late = post(url, stubborn, { ms: 60_000, stubborn: true });   // ignores its signal, outlives the timeout
      await Promise.all([stubborn, ...keys].map((key) => server.seen((v) => v.started === key, `the handler of ${key}`)));
      const signalled = performance.now();
      server.child.kill('SIGTERM');
      const { code, at } = await server.exited;
      const took = at - signalled;
      const settled = await Promise.all(answers);
      await late;
      const owners = settled.filter((a) => a.status === 201 && !a.replayed);
      const conflicts = settled.filter((a) => a.status === 409);
      t.diagnostic(`${framework}: exited ${Math.round(took)} ms after SIGTERM (graceful timeout ${GRACE} s); ` +
        `owners ${figures(owners.map((a) => a.ms))}; 409 ${figures(conflicts.map((a) => a.ms))}; ` +
        `replays ${settled.filter((a) => a.replayed).length}; other ${settled.length - owners.length - conflicts.length - settled.filter((a) => a.replayed).length}`);
      assert.equal(code, 0);
      assert.ok(took <= GRACE * 1000 + 1000, `exited ${Math.round(took)} ms after SIGTERM`);
      assert.equal(owners.length, keys.length, 'each handler that could finish in time answered');
      for (const a of settled) assert.ok([201, 409].includes(a.status), `${a.key}: ${a.status ?? a.error?.message}`);
      for (const key of keys) assert.equal((await keyRow(pool, key, scope))?.status, 'COMPLETED', key);
      assert.equal(await keyRow(pool, stubborn, scope), null, 'the handler past the timeout had its key given back');
      const { rows: [{ processing }] } = await pool.query(
        `SELECT count(*)::int AS processing FROM unnest($1::text[]) AS k(key), idempotency.idem_get(k.key, $2) AS g
          WHERE g.status = 'PROCESSING'`, [[stubborn, ...keys], scope]);
      assert.equal(processing, 0);
    });
  });
}

describe('a client that disconnects', () => {
  const scope = 'shutdown.disconnect';
  const server = startServer({ FRAMEWORK: 'express', LEASE: '1', WAIT: '0', SCOPE: scope });
  after(() => server.kill());

  test('aborts the handler\'s signal and stops its heartbeat: a retry takes the key over', async () => {
    const url = new URL(await server.url);
    const key = newKey('gone');
    const req = http.request({ host: url.hostname, port: url.port, method: 'POST', path: '/orders',
      headers: { 'content-type': 'application/json', 'idempotency-key': key } });
    req.on('error', () => {});
    req.end(JSON.stringify({ ms: 20_000, stubborn: true }));   // a handler that runs on for 20 s
    await server.seen((v) => v.started === key, 'the handler');
    req.destroy();
    await server.seen((v) => v.aborted === key, 'the handler\'s signal to abort', 10);
    // With a live heartbeat the key would stay in progress for 20 s; its
    // 1 s lease ends instead and a retry runs the handler again.
    let started = 0;
    const second = server.seen((v) => v.started === key && ++started === 2, 'the handler to run again', 15);
    let taken = false;
    second.then(() => { taken = true; }, () => {});
    const base = url.href.replace(/\/$/, '');
    await waitFor('a retry to take the key over', async () => {
      if (taken) return true;
      const answer = await Promise.race([post(base, key, { ms: 20_000, stubborn: true }), second]);
      return taken || answer.status !== 409;
    }, 10);
    assert.equal((await runsOf(base))[key], 2);
  });
});

// A claim still on its way to the server when the shutdown begins: the
// shutdown waits for it, and the key it claims is given back at once, its
// work never started. (The shutdown used to look only at the work already
// running: such a key was left PROCESSING when the process exited.)
describe('shutdown with claims under way', () => {
  test('a key claimed after the shutdown began is given back, its work not run', async () => {
    const { claim, shutdown } = await import('../src/index.js');
    const slow = Object.create(pool);   // a pool of its own for the client's state, slow to claim
    slow.query = async (text, params) => {
      if (String(text).includes('idem_claim')) await new Promise((resolve) => setTimeout(resolve, 300));
      return pool.query(text, params);
    };
    const key = newKey('under-way');
    let ran = false;
    const claiming = claim(slow, { key, scope: 'shutdown.claims' }, async () => { ran = true; return 'ran'; });
    await new Promise((resolve) => setTimeout(resolve, 50));   // the claim is on its way
    await shutdown(slow, { timeout: 2 });
    const answer = await claiming;
    assert.equal(answer.outcome, 'in_progress');
    assert.equal(ran, false);
    assert.notEqual((await keyRow(pool, key, 'shutdown.claims'))?.status, 'PROCESSING');
  });
});

describe('shutdown with work running', () => {
  test('a timeout of Infinity lets the running work finish; NaN or a negative one is refused', async () => {
    const { claim, shutdown } = await import('../src/index.js');
    const own = Object.create(pool);   // a pool of its own for the client's state
    own.query = (text, params) => pool.query(text, params);
    const key = newKey('forever');
    let aborted = false;
    const running = claim(own, { key, scope: 'shutdown.forever' }, async (job) => {
      await new Promise((resolve) => setTimeout(resolve, 400));
      aborted = job.signal.aborted;
      return 'finished';
    });
    await new Promise((resolve) => setTimeout(resolve, 50));   // the work runs
    await assert.rejects(shutdown(own, { timeout: Number.NaN }), /timeout must be/);
    await assert.rejects(shutdown(own, { timeout: -1 }), /timeout must be/);
    // Infinity was a delay past setTimeout's longest, which Node fires at once.
    await shutdown(own, { timeout: Number.POSITIVE_INFINITY });
    const answer = await running;
    assert.deepEqual([answer.outcome, answer.result, aborted], ['completed', 'finished', false]);
    assert.equal((await keyRow(pool, key, 'shutdown.forever')).status, 'COMPLETED');
  });
});
