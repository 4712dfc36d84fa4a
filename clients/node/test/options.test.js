// Options are checked when given: an option given as undefined or null
// keeps its default (lease: config.lease, unset, made heartbeats every
// millisecond), and a value that every request would fail on is refused
// at once, saying why. A result that is not JSON fails its key for good.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { claim, consume } from '../src/index.js';
import { httpOptions } from '../src/http.js';
import { keyRow, newKey, newPool } from './helpers.js';

const pool = newPool();
after(() => pool.end());

test('an option given as undefined or null keeps its default', () => {
  const opts = httpOptions({ pool, lease: undefined, wait: null, classify: undefined, header: undefined, methods: undefined });
  assert.equal(opts.lease, 30);
  assert.equal(opts.wait, 0);
  assert.equal(typeof opts.classify, 'function');
  assert.equal(opts.header, 'Idempotency-Key');
  assert.deepEqual(opts.methods, ['POST', 'PATCH']);
});

test('a value every request would fail on is refused when the middleware is made', () => {
  const refused = [
    [{ lease: 0 }, /lease must be a number of seconds from 1 µs to 2,147,483.647, not 0/],
    [{ lease: -1 }, /lease must be/],
    [{ lease: '30' }, /lease must be/],
    [{ lease: Number.NaN }, /lease must be/],
    [{ lease: 1e-9 }, /lease must be/],
    [{ lease: 1e12 }, /lease must be/],
    [{ wait: Number.POSITIVE_INFINITY }, /wait must be a number of seconds from 0 to 2,147,483.647, not Infinity/],
    [{ retryIn: -1 }, /retryIn must be/],
    // Taken, every retryable failure would be refused by the server: the
    // key stayed held and the handler ran again.
    [{ retryIn: 36000 * 86400 + 1 }, /retryIn must be a number of seconds from 0 to 3,110,400,000/],
    [{ retryIn: 1e11 }, /retryIn must be/],
    [{ classify: 'default' }, /classify must be a function/],
    [{ onReplay: 'x' }, /onReplay must be a function/], [{ onConflict: 1 }, /onConflict must be a function/],
    [{ onMismatch: 'x' }, /onMismatch must be a function/], [{ onFenced: {} }, /onFenced must be a function/],
    [{ onError: 'log' }, /onError must be a function/],
    [{ header: '' }, /header must be a non-empty string/],
    [{ methods: 'POST' }, /methods must be an array/],
    // Each failed every request, or every replay.
    [{ header: 'Idempotency Key' }, /header must be an HTTP header name/],
    [{ replayHeader: 'Idempotent Replayed' }, /replayHeader must be an HTTP header name/],
    [{ replayHeader: 'x\n' }, /replayHeader must be an HTTP header name/],
    [{ scope: 's'.repeat(64) }, /scope must be at most 63 bytes/],
    [{ pool: {} }, /pool option/],
  ];
  for (const [options, message] of refused) {
    assert.throws(() => httpOptions({ pool, ...options }), message, JSON.stringify(options));
  }
});

test('a consumer option the extension would refuse is refused when the consumer is made', () => {
  for (const [options, message] of [
    [{ batch: 0 }, /batch must be a whole number from 1 to 10000, not 0/], [{ batch: 10001 }, /batch must be/],
    [{ batch: 1.5 }, /batch must be/], [{ batch: '5' }, /batch must be/],
    [{ lease: 0 }, /lease must be/], [{ lease: Number.NaN }, /lease must be/],
    [{ pollInterval: 0 }, /pollInterval must be/], [{ pollInterval: -1 }, /pollInterval must be/],
    [{ concurrency: 0 }, /concurrency must be/],
    [{ name: 'n'.repeat(254) }, /name must be a non-empty string of at most 255 bytes with \/0 appended/],
    [{ name: '' }, /name must be/],
  ]) {
    assert.throws(() => consume(pool, { topics: ['t'], ...options }, async () => {}), message, JSON.stringify(options));
  }
});

test('claim: a lease of null is the default one; an absurd lease is refused', async () => {
  const key = newKey();
  let beats = 0;
  const counting = { query: (...args) => { if (String(args[0]).includes('idem_heartbeat')) beats += 1; return pool.query(...args); } };
  const done = await claim(Object.assign(Object.create(pool), counting), { key, lease: null }, async () => {
    await new Promise((resolve) => setTimeout(resolve, 300));
    return 'ok';
  });
  assert.equal(done.outcome, 'completed');
  assert.equal(beats, 0, 'no heartbeat within 300 ms of a 30 s lease');
  await assert.rejects(claim(pool, { key: newKey(), lease: 'soon' }, async () => 'never'), /lease must be/);
});

test('claim: work whose value is not JSON fails its key for good, and does not run again', async () => {
  for (const value of [{ amount: 10n }, (() => { const cycle = {}; cycle.self = cycle; return cycle; })()]) {
    const key = newKey();
    let runs = 0;
    const work = async () => { runs += 1; return value; };
    const failed = await claim(pool, { key }, work);
    assert.deepEqual([failed.outcome, failed.retryable], ['failed', false]);
    assert.match(failed.error, /cannot be stored as JSON/);
    assert.equal((await keyRow(pool, key)).status, 'FAILED_FINAL');
    assert.equal((await claim(pool, { key }, work)).replayed, true);
    assert.equal(runs, 1);
  }
});
