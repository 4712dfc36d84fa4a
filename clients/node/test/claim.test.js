import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import { FinalError, RetryableError, claim } from '../src/index.js';
import { groupId } from '../src/wait.js';
import { recordPatience } from '../src/record.js';
import { Heartbeat } from '../src/heartbeat.js';
import { expireResult, keyRow, newKey, newPool, sleep, waitFor } from './helpers.js';

const pool = newPool();
before(() => pool.query('CREATE TABLE IF NOT EXISTS effects (key text, worker text)'));
after(() => pool.end());

const effects = async (key) =>
  (await pool.query('SELECT worker FROM effects WHERE key = $1 ORDER BY worker', [key])).rows.map((r) => r.worker);

describe('claim', () => {
  test('runs the work once; a duplicate gets the stored result', async () => {
    const key = newKey();
    let runs = 0;
    const first = await claim(pool, { key, request: { n: 1 } }, async () => {
      runs += 1;
      return { sent: 'm-1' };
    });
    assert.deepEqual(first, { outcome: 'completed', result: { sent: 'm-1' }, replayed: false });
    const second = await claim(pool, { key, request: { n: 1 } }, async () => { runs += 1; });
    assert.deepEqual(second, { outcome: 'completed', result: { sent: 'm-1' }, replayed: true });
    assert.equal(runs, 1);
  });

  test('a duplicate after the result expired: resultExpired, never run again', async () => {
    const key = newKey();
    let runs = 0;
    await claim(pool, { key, request: { n: 1 } }, async () => { runs += 1; return { sent: 'm-1' }; });
    await expireResult(key);
    const late = await claim(pool, { key, request: { n: 1 } }, async () => { runs += 1; });
    assert.deepEqual(late, { outcome: 'completed', result: null, replayed: true, resultExpired: true });
    assert.deepEqual(await claim(pool, { key, request: { n: 2 } }, async () => { runs += 1; }), { outcome: 'mismatch' });
    assert.equal(runs, 1);
    // idem_get answers from the tombstone: no token, no attempts.
    assert.deepEqual(await keyRow(pool, key), { status: 'COMPLETED', attempts: null, token: null },
      'no key was created again');
  });

  test('a duplicate of a final failure whose error expired: failed, resultExpired', async () => {
    const key = newKey();
    await claim(pool, { key }, async () => { throw new FinalError('card refused'); });
    await expireResult(key);
    const late = await claim(pool, { key }, async () => assert.fail('ran again'));
    assert.deepEqual(late, {
      outcome: 'failed', error: null, retryable: false, retryAfter: null, replayed: true, resultExpired: true,
    });
  });

  test('another request under the key is a mismatch', async () => {
    const key = newKey();
    await claim(pool, { key, request: { n: 1 } }, async () => 'done');
    assert.deepEqual(await claim(pool, { key, request: { n: 2 } }, async () => 'again'), { outcome: 'mismatch' });
  });

  // A scope with no completion yet has no estimate of when the holder will
  // be done: retryAfter is the lease left (docs/keys.md).
  test('a key held by another worker is in progress, with the time its lease has left', async () => {
    const key = newKey();
    const scope = `no-estimate-${key}`;
    let inner;
    await claim(pool, { key, scope, lease: 20 }, async () => {
      inner = await claim(pool, { key, scope }, async () => assert.fail('ran twice'));
    });
    assert.equal(inner.outcome, 'in_progress');
    assert.ok(inner.retryAfter > 10 && inner.retryAfter <= 20, `retryAfter ${inner.retryAfter}`);
  });

  test('transaction(): the business writes and the complete commit together', async () => {
    const key = newKey();
    const outcome = await claim(pool, { key }, (job) => job.transaction(async (client) => {
      await client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [key, 'one']);
      return { rows: 1 };
    }));
    assert.deepEqual(outcome, { outcome: 'completed', result: { rows: 1 }, replayed: false });
    assert.deepEqual(await effects(key), ['one']);
    assert.equal((await keyRow(pool, key)).status, 'COMPLETED');
  });

  test('a thrown error is a retryable failure; the key is claimed again after the backoff', async () => {
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw new Error('provider timeout'); });
    assert.equal(failed.outcome, 'failed');
    assert.equal(failed.retryable, true);
    assert.equal(failed.error, 'provider timeout');
    assert.ok(failed.retryAfter >= 0 && failed.retryAfter < 1, `retryAfter ${failed.retryAfter}`);
    assert.equal((await keyRow(pool, key)).status, 'FAILED_RETRYABLE');
    const retried = await waitFor('the retry', async () => {
      const outcome = await claim(pool, { key }, async (job) => ({ attempt: job.attempt }));
      return outcome.outcome === 'completed' ? outcome : null;
    });
    assert.deepEqual(retried.result, { attempt: 2 });
  });

  test('RetryableError sets the retry delay', async () => {
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw new RetryableError('busy', { retryIn: 30 }); });
    assert.ok(failed.retryable && failed.retryAfter > 25 && failed.retryAfter <= 30, JSON.stringify(failed));
    assert.equal((await claim(pool, { key }, async () => 'x')).outcome, 'retry_later');
  });

  test('FinalError fails the key for good; duplicates get the failure', async () => {
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw new FinalError('card declined'); });
    assert.equal(failed.outcome, 'failed');
    assert.equal(failed.retryable, false);
    assert.equal((await keyRow(pool, key)).status, 'FAILED_FINAL');
    const again = await claim(pool, { key }, async () => assert.fail('ran again'));
    assert.deepEqual(again, { outcome: 'failed', error: 'card declined', retryable: false, retryAfter: null, replayed: true });
  });

  test('the classify option decides which errors are final', async () => {
    const key = newKey();
    const failed = await claim(pool, { key, classify: (err) => (err.status === 400 ? 'final' : 'retryable') },
      async () => { throw Object.assign(new Error('bad request'), { status: 400 }); });
    assert.equal(failed.retryable, false);
  });

  test('a classify that throws: the key fails as by default, and claim rejects with its error', async () => {
    const key = newKey();
    let runs = 0;
    const broken = new Error('classify is broken');
    await assert.rejects(claim(pool, { key, classify: () => { throw broken; } }, async () => {
      runs += 1;
      throw new Error('provider down');
    }), (err) => err === broken);
    const row = await keyRow(pool, key);
    assert.equal(row.status, 'FAILED_RETRYABLE', 'not left PROCESSING until its lease ends');
    assert.equal(runs, 1);
  });

  test('a retryIn the extension refuses: RetryableError refuses it; any other error\'s is ignored', async () => {
    for (const retryIn of [-1, Infinity, NaN, '5', 36000 * 86400 + 1]) {
      assert.throws(() => new RetryableError('x', { retryIn }), RangeError, String(retryIn));
    }
    assert.equal(new RetryableError('x', { retryIn: 0 }).retryIn, 0);
    assert.equal(new RetryableError('x').retryIn, null);
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw Object.assign(new Error('slow'), { retryIn: -5 }); });
    assert.equal(failed.outcome, 'failed');
    assert.equal(failed.retryable, true);
    assert.equal((await keyRow(pool, key)).status, 'FAILED_RETRYABLE');
  });

  test('a result holding a NUL character fails the key for good: the work runs once', async () => {
    const key = newKey();
    let runs = 0;
    const work = async () => { runs += 1; return { text: 'a\u0000b' }; };
    const first = await claim(pool, { key }, work);
    assert.equal(first.outcome, 'failed');
    assert.equal(first.retryable, false);
    assert.match(first.error, /NUL/);
    assert.equal((await claim(pool, { key }, work)).replayed, true);
    assert.equal(runs, 1);
    assert.equal((await claim(pool, { key: newKey() }, async () => ({ text: 'a\\u0000b' }))).outcome, 'completed',
      'a backslash followed by u0000 is not a NUL');
  });

  test('a result the server would refuse fails the key for good: the work runs once', async () => {
    // Each was refused after the work ran (22P02, 22001), and left the key
    // held: the work ran again once the lease ended.
    for (const [what, value, message] of [
      ['a lone surrogate', { s: 'a\ud800' }, /lone surrogate/],
      ['over idempotency.max_value_bytes (1 MB)', { big: 'x'.repeat(1024 * 1024 + 1) }, /^the result cannot be stored: .*must be at most/],
    ]) {
      const key = newKey();
      let runs = 0;
      const work = async () => { runs += 1; return value; };
      const first = await claim(pool, { key }, work);
      assert.deepEqual([first.outcome, first.retryable], ['failed', false], what);
      assert.match(first.error, message, what);
      assert.equal((await keyRow(pool, key)).status, 'FAILED_FINAL', what);
      assert.equal((await claim(pool, { key }, work)).replayed, true, what);
      assert.equal(runs, 1, what);
    }
    const key = newKey();
    const inTx = await claim(pool, { key }, (job) => job.transaction(async () => ({ big: 'x'.repeat(1024 * 1024 + 1) })));
    assert.deepEqual([inTx.outcome, inTx.retryable], ['failed', false], 'completed in the job\'s transaction');
    assert.equal((await keyRow(pool, key)).status, 'FAILED_FINAL');
  });

  test('work that rejects with no reason fails the key, as any throw does', async () => {
    for (const reason of [undefined, null, 0, '']) {
      const key = newKey();
      const failed = await claim(pool, { key }, async () => { throw reason; });
      assert.deepEqual([failed.outcome, failed.retryable], ['failed', true], String(reason));
      assert.match(failed.error, /^the work threw .*, not an Error$/);
      assert.equal((await keyRow(pool, key)).status, 'FAILED_RETRYABLE', String(reason));
    }
  });

  test('a key or scope holding a lone surrogate is refused: sent as U+FFFD, such keys would be one', async () => {
    for (const options of [{ key: `k-\ud800-${newKey()}` }, { key: newKey(), scope: 'scope-\udfff' }]) {
      await assert.rejects(claim(pool, options, async () => 'never'), /lone surrogate/);
    }
  });

  test('two requests the server tells apart never share a waiting poller (a Date is its string)', () => {
    const at = (ms) => ({ at: new Date(ms) });
    assert.notEqual(groupId('claim', 's', 'k', at(1), 30), groupId('claim', 's', 'k', at(2), 30));
    assert.equal(groupId('claim', 's', 'k', at(1), 30), groupId('claim', 's', 'k', { at: new Date(1).toJSON() }, 30));
  });

  test('an error message over 8 KiB is stored cut, saying so', async () => {
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw new Error('é'.repeat(1024 * 1024)); });
    assert.equal(failed.outcome, 'failed');
    assert.ok(Buffer.byteLength(failed.error) <= 8192 && failed.error.endsWith('[cut from 2097152 bytes]'), failed.error.slice(-40));
    assert.equal((await keyRow(pool, key)).status, 'FAILED_RETRYABLE', 'not left PROCESSING until its lease ends');
  });

  test('an error whose message holds a NUL fails the key, the NUL stored as U+FFFD', async () => {
    const key = newKey();
    const failed = await claim(pool, { key }, async () => { throw new Error('bad\u0000byte'); });
    assert.equal(failed.outcome, 'failed');
    assert.equal(failed.error, 'bad\uFFFDbyte');
    const row = await keyRow(pool, key);
    assert.equal(row.status, 'FAILED_RETRYABLE', 'not left PROCESSING until its lease ends');
  });

  test('release() gives the key back without counting an attempt', async () => {
    const key = newKey();
    assert.deepEqual(await claim(pool, { key }, (job) => job.release()), { outcome: 'released' });
    const next = await claim(pool, { key }, async (job) => job.attempt);
    assert.deepEqual(next.result, 1);
  });

  test('the heartbeat keeps a 1 s lease alive through 2.5 s of work', async () => {
    const key = newKey();
    const seen = [];
    const outcome = await claim(pool, { key, lease: 1 }, async (job) => {
      for (let i = 0; i < 5; i += 1) {
        await sleep(500);
        seen.push((await claim(pool, { key }, async () => assert.fail('ran twice'))).outcome);
      }
      return { aborted: job.signal.aborted };
    });
    assert.deepEqual(outcome.result, { aborted: false });
    assert.deepEqual(seen, Array(5).fill('in_progress'));
    assert.equal((await keyRow(pool, key)).attempts, 1);
  });

  test('the heartbeat is not queued behind a pool whose every connection is taken', async () => {
    // Through the pool, the beats waited for a connection past the lease:
    // the key was taken over and its work ran twice.
    const small = newPool({}, { max: 2 });
    try {
      const key = newKey();
      const outcome = await claim(small, { key, lease: 1 }, async () => {
        const held = await Promise.all([small.connect(), small.connect()]);
        try {
          await sleep(1500);
          const other = await claim(pool, { key }, async () => assert.fail('ran twice'));
          await sleep(1000);
          return other.outcome;
        } finally {
          for (const client of held) client.release();
        }
      });
      assert.equal(outcome.result, 'in_progress', JSON.stringify(outcome));
      assert.equal((await keyRow(pool, key)).attempts, 1);
    } finally {
      await small.end();
    }
  });

  test('a slow heartbeat gets no second beat queued behind it', async () => {
    // Behind a busy pooler, beats queued behind slow ones piled up on the
    // heartbeats' connection, which then kept no lease in time.
    let calls = 0;
    const slow = { query: () => { calls += 1; return sleep(350); } };
    const beat = new Heartbeat(slow, { key: newKey(), token: '1', scope: 'default', lease: 0.3 });
    await sleep(1000);   // ten intervals of 100 ms
    await beat.stop();
    assert.ok(calls <= 4, `${calls} beats for about three that could finish`);
  });

  // A pool of one connection, opened already, whose callers wait at most
  // 200 ms for it: a record's try then fails while another holds it. The
  // connection is opened before the limit is set, as opening one can take
  // longer than that on a busy machine.
  async function busyablePool() {
    const small = newPool({}, { max: 1 });
    (await small.connect()).release();
    small.options.connectionTimeoutMillis = 200;
    return small;
  }

  // A record that gave up at its least patience (10 s; here 0.5 s) while
  // the pool was busy left the key held until its lease ended, and the work
  // ran again. With a lease shorter than the wait, the heartbeat keeps the
  // lease: a record that gave up once the lease the claim set had ended
  // left the key PROCESSING under a lease its heartbeat still renewed.
  for (const [name, lease, holdMs, heartbeat] of [['while the lease lasts', 5, 1500, false],
    ['while the heartbeat keeps the lease', 1, 3000, true]]) {
    test(`a record waits for a busy pool ${name}`, async () => {
      const saved = recordPatience.ms;
      recordPatience.ms = 500;
      const small = await busyablePool();
      try {
        const key = newKey();
        const outcome = await claim(small, { key, lease, heartbeat }, async () => {
          const other = await small.connect();   // another request takes the only connection
          setTimeout(() => other.release(), holdMs);
          return 'done';
        });
        assert.deepEqual([outcome.outcome, outcome.result], ['completed', 'done'], JSON.stringify(outcome));
        assert.equal((await keyRow(pool, key)).status, 'COMPLETED');
      } finally {
        recordPatience.ms = saved;
        await small.end();
      }
    });
  }

  test('the heartbeat goes on while a busy pool delays the record', async () => {
    // Stopped before the record, the heartbeat let the lease end while the
    // record waited for the pool: another worker took the key over and the
    // work ran again.
    const small = newPool({}, { max: 2 });
    try {
      const key = newKey();
      let other = null;
      const outcome = await claim(small, { key, lease: 1 }, async () => {
        const held = [await small.connect(), await small.connect()];   // another request, for 2.5 leases
        setTimeout(async () => {
          other = await claim(pool, { key }, async () => 'ran twice');
          setTimeout(() => held.forEach((client) => client.release()), 500);
        }, 2000);
        return 'done';
      });
      assert.deepEqual([outcome.outcome, outcome.result], ['completed', 'done'], JSON.stringify(outcome));
      assert.equal(other?.outcome, 'in_progress', JSON.stringify(other));
      assert.equal((await keyRow(pool, key)).attempts, 1);
    } finally {
      await small.end();
    }
  });

  test('without a heartbeat the lease ends; the late worker is fenced and its writes roll back', async () => {
    const key = newKey();
    const late = await claim(pool, { key, lease: 1, heartbeat: false }, async (job) => {
      const takeover = await waitFor('the takeover', async () => {
        const outcome = await claim(pool, { key }, (other) => other.transaction(async (client) => {
          await client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [key, 'taker']);
          return 'taker';
        }));
        return outcome.outcome === 'completed' ? outcome : null;
      });
      assert.equal(takeover.result, 'taker');
      return job.transaction(async (client) => {
        await client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [key, 'late']);
        return 'late';
      });
    });
    assert.equal(late.outcome, 'fenced');
    assert.match(late.error, /token/i);
    assert.deepEqual(await effects(key), ['taker']);
  });

  test('a failed poll answers none of the waiting claims; they get the result', async () => {
    const key = newKey();
    const scope = 'node.poller.fault';
    // The waiters' pool fails its next `fail` claims without sending them,
    // as while the server restarts.
    const waiters = newPool();
    const query = waiters.query.bind(waiters);
    let claims = 0;
    let fail = 0;
    waiters.query = (text, params) => {
      if (typeof text === 'string' && text.includes('idem_claim(')) {
        claims += 1;
        if (fail > 0) {
          fail -= 1;
          return Promise.reject(new Error('the test failed this statement (the server restarting)'));
        }
      }
      return query(text, params);
    };
    try {
      let release;
      const held = new Promise((resolve) => { release = resolve; });
      const holder = claim(pool, { key, scope }, async () => { await held; return { done: 'yes' }; });
      await waitFor('the holder', async () => (await keyRow(pool, key, scope))?.status === 'PROCESSING');
      let answered = 0;
      const waiting = Array.from({ length: 10 }, () => {
        const answer = claim(waiters, { key, scope, wait: 20 }, async () => assert.fail('ran twice'))
          .finally(() => { answered += 1; });
        answer.catch(() => {});  // read below, with the others
        return answer;
      });
      let base = claims;
      await waitFor('two polls', () => claims >= base + 2);
      fail = 1;
      await waitFor('a failed poll', () => fail === 0);
      base = claims;
      await waitFor('a poll after it', () => claims >= base + 1);
      assert.equal(answered, 0, 'waiting claims answered after a failed poll');
      release();
      assert.deepEqual(await holder, { outcome: 'completed', result: { done: 'yes' }, replayed: false });
      for (const answer of await Promise.allSettled(waiting)) {
        assert.deepEqual(answer, { status: 'fulfilled', value: { outcome: 'completed', result: { done: 'yes' }, replayed: true } });
      }
    } finally {
      await waiters.end();
    }
  });
});

describe('a worker process', () => {
  const start = (key) => {
    const child = spawn(process.execPath, [new URL('./fixtures/worker.js', import.meta.url).pathname], {
      env: { ...process.env, KEY: key, LEASE: '1' }, stdio: ['pipe', 'pipe', 'inherit'],
    });
    child.stdout.setEncoding('utf8');
    child.output = '';
    child.stdout.on('data', (chunk) => { child.output += chunk; });
    return child;
  };

  // Claims until the key is free (the other worker's lease ended), then
  // does the work: the takeover.
  const takeOver = (key) => waitFor('the takeover', async () => {
    const outcome = await claim(pool, { key, lease: 10 }, (job) => job.transaction(async (client) => {
      await client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [key, 'taker']);
      return { attempt: job.attempt };
    }));
    return outcome.outcome === 'completed' ? outcome : null;
  });

  test('killed mid-job (SIGKILL): its key is taken over when the lease ends', async () => {
    const key = newKey();
    const child = start(key);
    await waitFor('the claim', () => child.output.includes('claimed'));
    child.kill('SIGKILL');
    await once(child, 'exit');
    const takeover = await takeOver(key);
    assert.deepEqual(takeover.result, { attempt: 2 });
    assert.deepEqual(await effects(key), ['taker']);
    const row = await keyRow(pool, key);
    assert.equal(row.status, 'COMPLETED');
    assert.equal(row.attempts, 2);
  });

  test('paused mid-job (SIGSTOP) past its lease: taken over, then fenced with IK001 when it resumes', async () => {
    const key = newKey();
    const child = start(key);
    await waitFor('the claim', () => child.output.includes('claimed'));
    child.kill('SIGSTOP');
    const takeover = await takeOver(key);
    assert.deepEqual(takeover.result, { attempt: 2 });
    child.kill('SIGCONT');
    child.stdin.end('go\n');
    await once(child, 'exit');
    const outcome = JSON.parse(child.output.trim().split('\n').pop());
    assert.equal(outcome.outcome, 'fenced', child.output);
    assert.deepEqual(await effects(key), ['taker'], 'the late worker wrote nothing');
    assert.equal((await keyRow(pool, key)).status, 'COMPLETED');
  });
});
