// Multi-step work through the worker helper: job.step() runs a step and
// records it with idem_step in the step's transaction, returns the stored
// result of a step that finished before (in an earlier attempt, which the
// claim resumes), and a worker that lost its key is fenced at its next step.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { RetryableError, claim, stepKey } from '../src/index.js';
import { keyRow, newKey, newPool, sleep, waitFor } from './helpers.js';

const pool = newPool();
before(() => pool.query('CREATE TABLE IF NOT EXISTS step_effects (key text, step text, worker text)'));
after(() => pool.end());

const effects = async (key) => (await pool.query(
  'SELECT step, worker FROM step_effects WHERE key = $1 ORDER BY step, worker', [key])).rows;

// A three-step job: reserve (a write here), charge (a provider, counted by
// the step's key), email; `stopAfter` ends the attempt after that step.
function job(worker, calls, stopAfter = null) {
  return async (j) => {
    const write = (step) => async (client) => {
      await client.query('INSERT INTO step_effects VALUES ($1, $2, $3)', [j.key, step, worker]);
      return { step, by: worker };
    };
    const out = { resumed: j.resumed, finished: [...j.steps.keys()] };
    out.reserve = await j.step('reserve', write('reserve'));
    if (stopAfter === 'reserve') throw new RetryableError('stopped after reserve', { retryIn: 0 });
    out.charge = await j.step('charge', async (client, step) => {
      calls.set(step.key, (calls.get(step.key) ?? 0) + 1);
      return { charge: step.key, by: worker };
    });
    if (stopAfter === 'charge') throw new RetryableError('stopped after charge', { retryIn: 0 });
    out.email = await j.step('email', write('email'));
    return out;
  };
}

describe('steps', () => {
  test('stepKey() is the key idem_step_key derives', async () => {
    for (const [scope, key, step] of [['default', 'order-42', 'charge'], ['payment.capture', 'order-42', 'charge'],
      ['s', 'clé-ünïcode-🔑', 'email:1'], ['a', 'b', 'c']]) {
      const { rows: [{ k }] } = await pool.query('SELECT idempotency.idem_step_key($1, $2, $3) AS k', [key, step, scope]);
      assert.equal(stepKey(scope, key, step), k);
    }
  });

  test('a job runs each step once; a retry resumes after the finished steps with their results', async () => {
    const key = newKey();
    const calls = new Map();
    const first = await claim(pool, { key }, job('one', calls, 'charge'));
    assert.equal(first.outcome, 'failed');
    assert.equal(first.retryable, true);
    const done = await waitFor('the retry', async () => {
      const outcome = await claim(pool, { key }, job('two', calls));
      return outcome.outcome === 'completed' ? outcome : null;
    });
    assert.equal(done.result.resumed, true);
    assert.deepEqual(done.result.finished, ['reserve', 'charge']);
    assert.deepEqual(done.result.reserve, { step: 'reserve', by: 'one' });
    assert.equal(done.result.charge.by, 'one');
    assert.deepEqual(done.result.email, { step: 'email', by: 'two' });
    assert.deepEqual(await effects(key), [{ step: 'email', worker: 'two' }, { step: 'reserve', worker: 'one' }]);
    assert.deepEqual([...calls.values()], [1]);
    assert.equal(calls.get(stepKey('default', key, 'charge')), 1);
    const { rows: [row] } = await pool.query('SELECT steps FROM idempotency.idem_get($1)', [key]);
    assert.deepEqual(Object.entries(row.steps).map(([name, s]) => [name, s.n, s.attempt]).sort((a, b) => a[1] - b[1]),
      [['reserve', 1, 1], ['charge', 2, 1], ['email', 3, 2]]);
  });

  test('a step that throws records nothing and its writes roll back', async () => {
    const key = newKey();
    const outcome = await claim(pool, { key }, async (j) => {
      await j.step('reserve', async (client) => {
        await client.query('INSERT INTO step_effects VALUES ($1, $2, $3)', [key, 'reserve', 'one']);
        throw new RetryableError('stock service down', { retryIn: 0 });
      });
    });
    assert.equal(outcome.outcome, 'failed');
    assert.deepEqual(await effects(key), []);
    const { rows: [row] } = await pool.query('SELECT steps FROM idempotency.idem_get($1)', [key]);
    assert.equal(row.steps, null);
  });

  test('a step whose result cannot be stored fails the key for good: the step ran once', async () => {
    const huge = 'x'.repeat(17000);   // past idempotency.max_step_bytes (16 kB)
    for (const [what, value, message] of [['not JSON', 10n, /cannot be stored as JSON/], ['a NUL', { s: 'a\u0000b' }, /NUL/],
      ['too large', { huge }, /^the step's result cannot be stored: /], ['a lone surrogate', { s: '\udc80' }, /lone surrogate/]]) {
      const key = newKey();
      let runs = 0;
      const work = async (j) => j.step('charge', async () => { runs += 1; return value; });
      const first = await claim(pool, { key }, work);
      assert.equal(first.outcome, 'failed', what);
      assert.equal(first.retryable, false, what);
      assert.match(first.error, message, what);
      assert.equal((await keyRow(pool, key)).status, 'FAILED_FINAL', what);
      assert.equal((await claim(pool, { key }, work)).replayed, true, what);
      assert.equal(runs, 1, what);
    }
  });

  test('a step past idempotency.max_steps fails the key for good: it ran once', async () => {
    // 54000 would come at every attempt, after the step's work.
    const key = newKey();
    let runs = 0;
    const work = async (j) => {
      for (let i = 0; i <= 32; i += 1) await j.step(`s${i}`, async () => { runs += 1; return i; });
    };
    const first = await claim(pool, { key }, work);
    assert.equal(first.outcome, 'failed');
    assert.equal(first.retryable, false);
    assert.match(first.error, /step cannot be recorded/);
    assert.equal((await claim(pool, { key }, work)).replayed, true);
    assert.equal(runs, 33);
  });

  test('a step name idem_step refuses fails the key for good before the step runs', async () => {
    for (const name of ['charge card', '', 'x'.repeat(64), 'café']) {
      const key = newKey();
      let runs = 0;
      const first = await claim(pool, { key }, async (j) => j.step(name, async () => { runs += 1; }));
      assert.equal(first.outcome, 'failed', name);
      assert.equal(first.retryable, false, name);
      assert.match(first.error, /step's name/, name);
      assert.equal(runs, 0, `${name}: the step ran`);
      assert.throws(() => stepKey('default', key, name), /step's name/);
      await assert.rejects(pool.query('SELECT idempotency.idem_step_key($1, $2)', [key, name]), (err) => ['22023', '22001'].includes(err.code),
        'the server refuses it too');
    }
    assert.equal(stepKey('s', 'k', 'a'.repeat(63)).length, 63 + 33, 'a name of 63 bytes is taken');
  });

  test('a step finished in this attempt is not run again', async () => {
    const key = newKey();
    let runs = 0;
    const outcome = await claim(pool, { key }, async (j) => {
      const a = await j.step('once', async () => { runs += 1; return { n: runs }; });
      const b = await j.step('once', async () => { runs += 1; return { n: runs }; });
      return { a, b, steps: j.steps.size };
    });
    assert.deepEqual(outcome.result, { a: { n: 1 }, b: { n: 1 }, steps: 1 });
  });

  test('a step called twice in parallel runs once; both calls get its result', async () => {
    const key = newKey();
    let runs = 0;
    const outcome = await claim(pool, { key }, async (j) => {
      const charge = async () => { runs += 1; await sleep(50); return { charged: runs }; };
      return Promise.all([j.step('charge', charge), j.step('charge', charge)]);
    });
    assert.equal(outcome.outcome, 'completed', JSON.stringify(outcome));
    assert.deepEqual(outcome.result, [{ charged: 1 }, { charged: 1 }]);
    assert.equal(runs, 1);
  });

  test('a worker whose key was taken over is fenced at its next step, which rolls back', async () => {
    const key = newKey();
    const calls = new Map();
    let takeover;
    let lateCharged = false;
    const late = await claim(pool, { key, lease: 1, heartbeat: false }, async (j) => {
      await j.step('reserve', async (client) => {
        await client.query('INSERT INTO step_effects VALUES ($1, $2, $3)', [key, 'reserve', 'late']);
        return 'reserved';
      });
      await sleep(1200);
      takeover = await claim(pool, { key }, job('taker', calls));
      return j.step('charge', async (client) => {
        lateCharged = true;
        await client.query('INSERT INTO step_effects VALUES ($1, $2, $3)', [key, 'charge', 'late']);
        return 'late charge';
      });
    });
    assert.equal(late.outcome, 'fenced');
    assert.equal(lateCharged, false, 'the late worker ran a step the taker had finished');
    assert.equal(takeover.outcome, 'completed');
    assert.deepEqual(takeover.result.finished, ['reserve']);
    assert.equal(takeover.result.reserve, 'reserved');
    assert.deepEqual(await effects(key),
      [{ step: 'email', worker: 'taker' }, { step: 'reserve', worker: 'late' }]);
    assert.equal((await keyRow(pool, key)).status, 'COMPLETED');
  });
});
