import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { FinalError, RetryableError, claim, consume, enqueue, settlement } from '../src/index.js';
import { adminPool, newKey, newPool, waitFor } from './helpers.js';

const pool = newPool({ 'idempotency.outbox_max_attempts': '3' });
const admin = adminPool();
after(() => Promise.all([pool.end(), admin.end()]));

const state = async (id) =>
  (await admin.query('SELECT state::text, attempts, last_error FROM idempotency.outbox WHERE id = $1', [id])).rows[0];

async function inTransaction(fn, commit = true) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const value = await fn(client);
    await client.query(commit ? 'COMMIT' : 'ROLLBACK');
    return value;
  } finally {
    client.release();
  }
}

describe('enqueue', () => {
  test('joins the caller\'s transaction: a rollback leaves no event', async () => {
    const topic = newKey('topic');
    const kept = await inTransaction((client) => enqueue(client, topic, [1, 2, 3]));
    const dropped = await inTransaction((client) => enqueue(client, topic, { n: 2 }), false);
    assert.equal((await state(kept)).state, 'pending');
    assert.equal(await state(dropped), undefined);
    const { rows } = await admin.query('SELECT payload FROM idempotency.outbox WHERE topic = $1', [topic]);
    assert.deepEqual(rows.map((r) => r.payload), [[1, 2, 3]], 'an array payload stays a JSON array');
  });

  test('a dedup key enqueues at most once; key, headers and deliverAt are passed on', async () => {
    const topic = newKey('topic');
    const later = new Date(Date.now() + 3600_000);
    const first = await enqueue(pool, topic, { n: 1 }, { dedupKey: 'd-1', key: 'k', headers: { tenant: 'acme' }, deliverAt: later });
    const second = await enqueue(pool, topic, { n: 1 }, { dedupKey: 'd-1' });
    assert.equal(first, second);
    const { rows: [row] } = await admin.query(
      'SELECT key, headers, available_at >= now() + interval \'59 minutes\' AS later FROM idempotency.outbox WHERE id = $1', [first]);
    assert.deepEqual(row, { key: 'k', headers: { tenant: 'acme' }, later: true });
  });
});

describe('settlement', () => {
  test('maps handler results and errors to ack, nack or leave', () => {
    assert.deepEqual(settlement(undefined, null), ['ack']);
    assert.deepEqual(settlement({ outcome: 'completed', result: 1, replayed: true }, null), ['ack']);
    assert.deepEqual(settlement({ outcome: 'failed', error: 'e', retryable: true, retryAfter: 2, replayed: false }, null),
      ['nack', 'e', true, 2]);
    assert.deepEqual(settlement({ outcome: 'failed', error: 'e', retryable: false, retryAfter: null, replayed: false }, null),
      ['nack', 'e', false, null]);
    assert.deepEqual(settlement({ outcome: 'failed', error: 'e', retryable: false, replayed: true }, null), ['ack']);
    assert.deepEqual(settlement({ outcome: 'in_progress', retryAfter: 4 }, null), ['release', 4]);
    assert.deepEqual(settlement({ outcome: 'retry_later', retryAfter: 0.2 }, null), ['release', 0.2]);
    assert.equal(settlement({ outcome: 'mismatch' }, null)[2], false);
    assert.deepEqual(settlement({ outcome: 'fenced', error: 'x' }, null), ['leave']);
    assert.deepEqual(settlement(undefined, new RetryableError('slow', { retryIn: 3 })), ['nack', 'slow', true, 3]);
    assert.deepEqual(settlement(undefined, new FinalError('bad')), ['nack', 'bad', false, null]);
    assert.deepEqual(settlement(undefined, Object.assign(new Error('stale'), { code: 'IK001' })), ['leave']);
    assert.deepEqual(settlement(undefined, Object.assign(new Error('odd'), { retryIn: -1 })), ['nack', 'odd', true, null],
      'a retryIn the extension refuses: its backoff instead');
    const heard = [];
    const broken = () => { throw new Error('classify is broken'); };
    assert.deepEqual(settlement(undefined, new FinalError('bad'), broken, (err) => heard.push(err.message)),
      ['nack', 'bad', false, null], 'a classify that throws: the default classification');
    assert.deepEqual(heard, ['classify is broken']);
    assert.deepEqual(settlement(undefined, new Error('bad\u0000byte')), ['nack', 'bad\uFFFDbyte', true, null],
      'text cannot hold NUL');
  });
});

describe('consume', () => {
  test('acks what the handler returns, retries what it throws, buries final failures', async () => {
    const topic = newKey('topic');
    const ok = await enqueue(pool, topic, { kind: 'ok' });
    const flaky = await enqueue(pool, topic, { kind: 'flaky' });
    const poison = await enqueue(pool, topic, { kind: 'poison' });
    const seen = [];
    const consumer = consume(pool, { topics: topic, name: 'test', pollInterval: 0.2, onError: () => {} }, async (event) => {
      seen.push(`${event.payload.kind}#${event.attempt}`);
      if (event.payload.kind === 'flaky' && event.attempt === 1) throw new RetryableError('not yet', { retryIn: 0 });
      if (event.payload.kind === 'poison') throw new FinalError('cannot parse');
    });
    await waitFor('the events to settle', async () => (await state(flaky)).state === 'delivered' && (await state(poison)).state === 'dead');
    await consumer.stop();
    assert.equal((await state(ok)).state, 'delivered');
    assert.equal((await state(poison)).last_error, 'cannot parse');
    assert.deepEqual(seen.sort(), ['flaky#1', 'flaky#2', 'ok#1', 'poison#1']);
  });

  test('a handler that rejects with no reason has its event nacked, not acked', async () => {
    const topic = newKey('topic');
    const id = await enqueue(pool, topic, { kind: 'undefined' });
    const consumer = consume(pool, { topics: topic, name: 'test', pollInterval: 0.2, onError: () => {} },
      async () => Promise.reject());   // a bare reject(): no reason
    await waitFor('the event to be nacked', async () => (await state(id)).attempts >= 1 && (await state(id)).last_error !== null);
    await consumer.stop();
    const after = await state(id);
    assert.notEqual(after.state, 'delivered');
    assert.match(after.last_error, /the work threw undefined, not an Error/);
  });

  test('on a pool with no connection to spare it polls instead of holding one for LISTEN', { timeout: 30000 }, async () => {
    const small = newPool();
    small.options.max = 1;
    try {
      const topic = newKey('topic');
      const id = await enqueue(pool, topic, { kind: 'ok' });
      const consumer = consume(small, { topics: topic, name: 'test', pollInterval: 0.2, onError: () => {} }, async () => {});
      await waitFor('the event to be delivered', async () => (await state(id)).state === 'delivered');
      await consumer.stop();
    } finally {
      await small.end();
    }
  });

  test('wakes on the notification of a new event, well before its poll', async () => {
    const topic = newKey('topic');
    const delivered = [];
    const consumer = consume(pool, { topics: [topic], pollInterval: 30 }, async (event) => { delivered.push(event.id); });
    await new Promise((resolve) => setTimeout(resolve, 300));   // the consumer is idle, listening
    const id = await enqueue(pool, topic, { n: 1 });
    await waitFor('the delivery', () => delivered.includes(id), 10);
    await consumer.stop();
  });

  test('as a job queue: duplicate jobs of one key run the work once and are all delivered', async () => {
    const topic = newKey('topic');
    const key = newKey();
    const ids = [];
    for (const run of [1, 2, 3]) ids.push(await enqueue(pool, topic, { key, amount: 5 }, { dedupKey: `${key}/${run}` }));
    let runs = 0;
    const consumer = consume(pool, { topics: topic, concurrency: 3, pollInterval: 0.2 }, (event) =>
      claim(pool, { key: event.payload.key, request: event.payload, scope: 'jobs', wait: 10 }, async () => {
        runs += 1;
        await new Promise((resolve) => setTimeout(resolve, 200));
        return { paid: event.payload.amount };
      }));
    await waitFor('every job delivered', async () => {
      const states = await Promise.all(ids.map(state));
      return states.every((s) => s.state === 'delivered');
    });
    await consumer.stop();
    assert.equal(runs, 1);
  });

  // An event whose key another worker holds (a claim whose worker died,
  // its lease 3 s) did not fail: it comes back without an attempt counted
  // until the key is free, then the work runs once and the event is acked.
  // The scope's quick completions make in_progress answer a retry_after of
  // milliseconds: nacked after it, the event used up its attempts (3 here)
  // at once and died without the work ever running.
  test('an event whose key another worker holds waits for it, no attempt counted', async () => {
    const topic = newKey('topic');
    const scope = newKey('held');
    for (let i = 0; i < 10; i += 1) {
      const outcome = await claim(pool, { key: `quick-${i}`, scope, lease: 3 }, async () => 'ok');
      assert.equal(outcome.outcome, 'completed');
    }
    await pool.query("SELECT idempotency.idem_claim('held', lease => interval '3 seconds', scope => $1)", [scope]);
    const id = await enqueue(pool, topic, { n: 1 }, { key: 'held' });
    let runs = 0;
    let deliveries = 0;
    const consumer = consume(pool, { topics: topic, pollInterval: 0.1, lease: 10, onError: () => {} }, (event) => {
      deliveries += 1;
      return claim(pool, { key: 'held', scope, lease: 3 }, async () => { runs += 1; return 'done'; });
    });
    await waitFor('the event delivered or dead', async () => ['delivered', 'dead'].includes((await state(id)).state), 40);
    await consumer.stop();
    assert.equal((await state(id)).state, 'delivered');
    assert.equal(runs, 1);
    assert.ok(deliveries >= 2, `${deliveries} deliveries`);
  });

  test('stop() lets the event in hand finish', async () => {
    const topic = newKey('topic');
    const id = await enqueue(pool, topic, { n: 1 });
    let started;
    const running = new Promise((resolve) => { started = resolve; });
    let finished = false;
    const consumer = consume(pool, { topics: topic }, async () => {
      started();
      await new Promise((resolve) => setTimeout(resolve, 300));
      finished = true;
    });
    await running;
    await consumer.stop();
    assert.equal(finished, true);
    assert.equal((await state(id)).state, 'delivered');
  });
});
