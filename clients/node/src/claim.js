// The worker pattern: claim a key with a lease, run the work while a
// heartbeat keeps the lease, and record how it ended: complete (the result
// is stored and replayed to every duplicate), fail (retryable or final), or
// nothing at all when the key was taken over meanwhile (fenced).
import { UnstorableResult, classifyOr, defaultClassify, errorText, isStaleToken, retryInOrNull, thrown } from './errors.js';
import { Heartbeat } from './heartbeat.js';
import { callHook } from './hooks.js';
import { checkSeconds } from './options.js';
import { ASSERT_OWNER, CLAIM, COMPLETE, FAIL, NEXT_ATTEMPT, RELEASE, jsonParam, storable } from './sql.js';
import { claimWhileOpen, isClosing, track } from './state.js';
import { retryLost } from './record.js';
import { parseSteps, runStep, stepKey } from './steps.js';
import { withTransaction } from './transaction.js';
import { claimWaiting, groupId } from './wait.js';

const DEFAULT_LEASE = 30;

// A claimed key, handed to the work function.
export class Job {
  #beat;
  #claimedLeaseEnds;

  constructor(pool, { key, token, scope, attempt, lease, signal, steps = null, heartbeat = null }) {
    Object.assign(this, { key, token, scope, attempt, lease, signal });
    this.pool = pool;
    this.#beat = heartbeat;
    this.#claimedLeaseEnds = Date.now() + lease * 1000;
    this.finished = null;   // 'completed' or 'released' once recorded
    this.result = undefined;
    // The steps finished so far, by name, in their order: those an earlier
    // attempt finished (this claim resumes after them), then this job's.
    this.steps = parseSteps(steps);
    this.resumed = this.steps.size > 0;
  }

  // When the lease ends at the latest (ms since the epoch), as the claim or
  // the last heartbeat set it: a record keeps trying until then (record.js).
  get leaseEnds() {
    return Math.max(this.#claimedLeaseEnds, this.#beat?.leaseEnds ?? 0);
  }

  // A step of multi-step work: the stored result when it finished before
  // (in an earlier attempt, or in this one), else fn(client, { key }) in a
  // transaction of its own, recorded with idem_step in that transaction
  // (so its writes on `client` commit with the record, or neither does).
  // `key` is the step's key for an external call (idem_step_key).
  step(name, fn) {
    return runStep(this, name, fn);
  }

  // The key of a step's external call (the same as idem_step_key).
  stepKey(name) {
    return stepKey(this.scope, this.key, name);
  }

  // Fences the caller's transaction: IK001 unless this job still holds the
  // key; the key's row stays locked until that transaction ends.
  async fence(client) {
    await client.query(ASSERT_OWNER, [this.key, this.token, this.scope]);
  }

  // Stores the result, on `client` (inside the caller's transaction, after
  // the business writes) or in a statement of its own, tried again after a
  // lost connection (record.js).
  // UnstorableResult (retryable false) for a result that cannot be stored.
  async complete(result = null, client = this.pool) {
    const params = [this.key, this.token, storable(result), this.scope];
    try {
      if (client === this.pool) {
        await retryLost(this.pool, this, () => this.pool.query(COMPLETE, params), ['COMPLETED'], () => null);
      } else {
        await client.query(COMPLETE, params);
      }
    } catch (err) {
      // 22xxx, for the result (the claim took the rest): larger than
      // idempotency.max_value_bytes, or not in the database's encoding.
      if (String(err?.code).startsWith('22')) throw new UnstorableResult(err, 'the result cannot be stored');
      throw err;
    }
    this.finished = 'completed';
    this.result = result;
    return result;
  }

  // Fence, business writes and complete in one transaction: fn(client)
  // returns the result to store.
  transaction(fn) {
    return withTransaction(this.pool, async (client) => {
      await this.fence(client);
      return this.complete(await fn(client), client);
    });
  }

  // Gives the key back without counting an attempt.
  async release() {
    await this.pool.query(RELEASE, [this.key, this.token, this.scope]);
    this.finished = 'released';
  }
}

// claim(pool, { key, request, scope, lease, wait, heartbeat, classify,
// signal, onReplay, onConflict, onFenced }, work) resolves to one of:
//   { outcome: 'completed', result, replayed }     done now, or a duplicate of finished work
//   { outcome: 'failed', error, retryable, retryAfter, replayed, cause }
//     a duplicate of work finished so long ago that only the key's tombstone
//     is left has resultExpired: true (result and error null): it is never
//     run again, and what it returned cannot be replayed
//   { outcome: 'in_progress' | 'retry_later', retryAfter }   someone else holds it / backoff
//   { outcome: 'mismatch' }                        the key was used with another request
//   { outcome: 'fenced', error }                   the lease was lost and the key taken over
//   { outcome: 'released' }                        the work gave the key back
// With `wait`, a key held by another worker is waited for without holding
// a connection of the pool (see wait.js).
export async function claim(pool, options, work) {
  const { key, request = null, scope = 'default', wait = null, signal = null } = options;
  // A lone surrogate is sent as U+FFFD: two such keys would be one.
  for (const [name, value] of [['key', key], ['scope', scope]]) {
    if (typeof value === 'string' && !value.isWellFormed()) {
      throw new TypeError(`idempotency: ${name} holds a lone surrogate (not UTF-8): ${JSON.stringify(value)}`);
    }
  }
  const lease = options.lease ?? DEFAULT_LEASE;
  checkSeconds('lease', lease, { positive: true });
  if (wait !== null && wait !== undefined) checkSeconds('wait', wait);
  if (isClosing(pool)) return { outcome: 'in_progress', retryAfter: 1 };
  const params = [key, jsonParam(request), lease, scope, null];
  const { row } = await claimWaiting(pool, {
    id: groupId('claim', scope, key, request, lease),
    wait,
    signal,
    attempt: async () => {
      const giveBack = (claimed) => pool.query(RELEASE, [key, claimed.token, scope]);
      const claimed = await claimWhileOpen(pool, async () => (await pool.query(CLAIM, params)).rows[0], giveBack);
      return { row: claimed, abandon: () => giveBack(claimed) };
    },
  });
  const event = { key, scope, outcome: row.outcome };
  switch (row.outcome) {
    case 'claimed':
      return run(pool, { ...options, key, scope, lease }, row, work);
    case 'completed':
      callHook(options.onReplay, expiredAnswer(event, row));
      return expiredAnswer({ outcome: 'completed', result: row.result, replayed: true }, row);
    case 'failed':
      callHook(options.onReplay, expiredAnswer(event, row));
      return expiredAnswer({ outcome: 'failed', error: row.error, retryable: false, retryAfter: null, replayed: true }, row);
    case 'in_progress':
    case 'retry_later':
      callHook(options.onConflict, { ...event, retryAfter: row.retry_after ?? 0 });
      return { outcome: row.outcome, retryAfter: row.retry_after ?? 0 };
    default:
      return { outcome: row.outcome };
  }
}

// A replay answered from the key's tombstone says so.
function expiredAnswer(answer, row) {
  return row.result_expired ? { ...answer, resultExpired: true } : answer;
}

async function run(pool, options, row, work) {
  const { key, scope, lease, heartbeat = true, classify = defaultClassify, signal = null } = options;
  const beat = heartbeat ? new Heartbeat(pool, { key, token: row.token, scope, lease }) : null;
  // job.signal: aborted when the lease is lost, the caller's signal
  // aborts, or a shutdown ends the work.
  const controller = new AbortController();
  const forward = (source) => {
    if (!source) return;
    if (source.aborted) controller.abort(source.reason);
    else source.addEventListener('abort', () => controller.abort(source.reason), { once: true });
  };
  forward(beat?.signal);
  forward(signal);
  const job = new Job(pool, {
    key, token: row.token, scope, attempt: row.attempt, lease, signal: controller.signal, steps: row.steps, heartbeat: beat,
  });
  let settled;
  let stopped = false;
  const untrack = track(pool, {
    settled: new Promise((resolve) => { settled = resolve; }),
    stop: async (reason) => {
      stopped = true;
      controller.abort(reason);
      await beat?.stop();
      if (!job.finished) await pool.query(RELEASE, [key, row.token, scope]).catch(() => {});
    },
  });
  const fenced = (err) => {
    callHook(options.onFenced, { key, scope, outcome: 'fenced', error: err.message });
    return { outcome: 'fenced', error: err.message };
  };
  try {
    let value;
    let error = null;
    try {
      value = await work(job);
    } catch (err) {
      error = thrown(err);
    }
    // The heartbeat goes on while the outcome is recorded: a record that
    // waits for a busy pool must not let the lease end, or another worker
    // takes the key over and runs the work again.
    if (beat) beat.recording = true;
    if (stopped) return { outcome: 'released' };   // a shutdown gave the key back
    if (error && job.finished) throw error;   // after the key was recorded: the caller's own error
    try {
      if (error) {
        if (isStaleToken(error)) return fenced(error);
        // A classify that throws: the key fails as by default, then claim
        // rejects with classify's error.
        let classifyError = null;
        // A result (a step's) that cannot be stored would be so again.
        const kind = error instanceof UnstorableResult
          ? 'final' : classifyOr(classify, defaultClassify, error, (err) => { classifyError = err; });
        const failed = await fail(pool, job, error, kind);
        if (classifyError) throw classifyError;
        return failed;
      }
      if (job.finished === 'released') return { outcome: 'released' };
      if (job.finished !== 'completed') await job.complete(value ?? null);
      return { outcome: 'completed', result: job.result, replayed: false };
    } catch (err) {
      if (isStaleToken(err)) return fenced(err);
      // Left held, the key would run its work again once the lease ended,
      // to the same end: it fails for good.
      if (err instanceof UnstorableResult) return await fail(pool, job, err, 'final');
      throw err;
    }
  } finally {
    await beat?.stop();
    untrack();
    settled();
  }
}

async function fail(pool, job, error, kind) {
  const message = errorText(error);
  // An error's retryIn the extension would refuse: its backoff instead.
  const retryIn = kind === 'final' ? null : retryInOrNull(error?.retryIn);
  const dueAfter = async (client) => (await client.query(NEXT_ATTEMPT, [job.key, job.scope])).rows[0]?.retry_after ?? null;
  const { status, retryAfter } = await retryLost(pool, job, () => withTransaction(pool, async (client) => {
    const { rows: [failed] } = await client.query(FAIL,
      [job.key, job.token, message, kind !== 'final', retryIn, job.scope]);
    return { status: failed.status, retryAfter: await dueAfter(client) };
  }), ['FAILED_RETRYABLE', 'FAILED_FINAL'], async (row) => ({ status: row.status, retryAfter: await dueAfter(pool) }));
  const retryable = status === 'FAILED_RETRYABLE';
  return {
    outcome: 'failed', error: message, retryable,
    retryAfter: retryable ? Math.max(0, retryAfter ?? 0) : null, replayed: false, cause: error,
  };
}
