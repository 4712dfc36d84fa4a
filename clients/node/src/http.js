// The Idempotency-Key header, independent of any framework: what to answer
// before the handler runs, and what to record once it has answered.
// express.js and fastify.js adapt it.
//
//   no key, required              400
//   in progress / retry later     409 with Retry-After (or wait up to `wait`)
//   key reused, another request   422
//   done                          the stored response, Idempotent-Replayed: true
//   new                           the handler runs; its response is stored
//                                 (or, failed, classified retryable or final)
//
// Modes:
//   'claim'        the key is claimed (committed), the handler runs under a
//                  heartbeat, its response is stored after it answers;
//   'transaction'  claim, the handler's writes on req.idempotency.client and
//                  the stored response commit together;
//   'register'     the key is registered and the handler (typically: enqueue
//                  a job on req.idempotency.client, answer 202) commits with
//                  it; a worker claims and completes the key later, and
//                  requests replay what it stored.
import { defaultFingerprint } from './fingerprint.js';
import { Heartbeat } from './heartbeat.js';
import { decodeResponse, encodeResponse, isStoredResponse, jsonResponse, problem, response, storedFailure } from './response.js';
import { ASSERT_OWNER, CLAIM, COMPLETE, FAIL, REGISTER, jsonParam } from './sql.js';

const MODES = new Set(['claim', 'transaction', 'register']);

// 'complete' (store and replay it), 'final' (store it as a final failure,
// replayed too) or 'retryable' (not stored: the next request runs again).
export function defaultClassify({ status }) {
  if (status >= 500 || status === 408 || status === 425 || status === 429) return 'retryable';
  return status >= 400 ? 'final' : 'complete';
}

export function httpOptions(options = {}) {
  const opts = {
    scope: 'default',
    mode: 'claim',
    required: true,
    methods: ['POST', 'PATCH'],
    header: 'Idempotency-Key',
    replayHeader: 'Idempotent-Replayed',
    lease: 30,
    wait: 0,
    retryIn: 0,
    fingerprint: defaultFingerprint,
    classify: defaultClassify,
    completedResponse: (result) => jsonResponse(200, result),
    failedResponse: (error) => problem(500, 'Request failed', error),
    ...options,
  };
  if (!opts.pool) throw new TypeError('idempotency: the pool option is required');
  if (!MODES.has(opts.mode)) throw new TypeError(`idempotency: unknown mode ${opts.mode}`);
  opts.methods = opts.methods.map((m) => m.toUpperCase());
  return opts;
}

// A replay: the stored response (or what a hook made of the key's state).
function replay(opts, { status, headers, body }) {
  return response(status, { ...headers, [opts.replayHeader.toLowerCase()]: 'true' }, body);
}

// The response a key's settled state is answered with.
function answer(opts, row) {
  switch (row.outcome) {
    case 'completed':
      return replay(opts, isStoredResponse(row.result) ? decodeResponse(row.result) : opts.completedResponse(row.result));
    case 'failed': {
      const stored = storedFailure(row.error);
      return replay(opts, stored ? decodeResponse(stored) : opts.failedResponse(row.error));
    }
    case 'mismatch':
      return problem(422, 'Idempotency-Key reused',
        'This Idempotency-Key was already used with a different request.');
    default: // in_progress, retry_later
      return problem(409, 'Request in progress',
        'A request with this Idempotency-Key is being processed; retry later.',
        { 'retry-after': String(Math.max(1, Math.ceil(row.retry_after ?? 1))) });
  }
}

// begin(opts, { method, key, path, body }) resolves to { response } to send
// now, or { exchange } when the handler is to run (pass it the context,
// then call exchange.finish(response) or exchange.abort(error)), or {} when
// the request does not take part (method not covered, optional key absent).
export async function begin(opts, { method, key, path, body }) {
  if (!opts.methods.includes(method)) return {};
  if (!key) {
    if (!opts.required) return {};
    return { response: problem(400, 'Idempotency-Key is missing', `This request requires an ${opts.header} header.`) };
  }
  if (Buffer.byteLength(key) > 255) {
    return { response: problem(400, 'Idempotency-Key is too long', 'At most 255 bytes.') };
  }
  const request = opts.fingerprint({ method, path, body });
  if (opts.mode === 'claim') return beginClaim(opts, key, request);
  return beginInTransaction(opts, key, request);
}

async function beginClaim(opts, key, request) {
  const { rows: [row] } = await opts.pool.query(CLAIM,
    [key, jsonParam(request), opts.lease, opts.scope, opts.wait || null]);
  if (row.outcome !== 'claimed') return { response: answer(opts, row) };
  const beat = new Heartbeat(opts.pool, { key, token: row.token, scope: opts.scope, lease: opts.lease });
  const record = async (sql, params) => {
    await beat.stop();
    await opts.pool.query(sql, params);
  };
  return {
    exchange: new Exchange(opts, { key, request, token: row.token, attempt: row.attempt, signal: beat.signal }, {
      complete: (stored) => record(COMPLETE, [key, row.token, jsonParam(stored), opts.scope]),
      fail: (error, retryable) => record(FAIL, [key, row.token, error, retryable, retryable ? opts.retryIn : null, opts.scope]),
      discard: () => beat.stop(),
    }),
  };
}

async function beginInTransaction(opts, key, request) {
  const client = await opts.pool.connect();
  const end = async (sql) => {
    try {
      await client.query(sql);
    } finally {
      client.release();
    }
  };
  let row;
  try {
    await client.query('BEGIN');
    ({ rows: [row] } = opts.mode === 'register'
      ? await client.query(REGISTER, [key, jsonParam(request), key, opts.scope])
      : await client.query(CLAIM, [key, jsonParam(request), opts.lease, opts.scope, opts.wait || null]));
    if (row.outcome === 'registered' || row.outcome === 'claimed') await client.query('SAVEPOINT idempotent_handler');
  } catch (err) {
    await end('ROLLBACK').catch(() => {});
    throw err;
  }
  if (row.outcome !== 'registered' && row.outcome !== 'claimed') {
    await end('COMMIT');   // nothing was written
    return { response: answer(opts, row) };
  }
  const context = { key, request, token: row.token, attempt: row.attempt, client };
  const registering = opts.mode === 'register';
  // Runs the statements of an outcome, then COMMIT; ROLLBACK if any fails.
  const settle = async (statements) => {
    try {
      await statements();
    } catch (err) {
      await end('ROLLBACK').catch(() => {});
      throw err;
    }
    await end('COMMIT');
  };
  return {
    exchange: new Exchange(opts, context, {
      // register: the key stays RECEIVED for the worker; nothing is stored.
      complete: (stored) => settle(async () => {
        if (!registering) await client.query(COMPLETE, [key, row.token, jsonParam(stored), opts.scope]);
      }),
      // Retryable: as if the request never came. Final: the handler's writes
      // are undone, the failure and its response are kept (not in register
      // mode, where the key only exists with its job).
      fail: async (error, retryable) => {
        if (retryable || registering) return end('ROLLBACK');
        return settle(async () => {
          await client.query('ROLLBACK TO SAVEPOINT idempotent_handler');
          await client.query(FAIL, [key, row.token, error, false, null, opts.scope]);
        });
      },
      discard: () => end('ROLLBACK'),
    }),
  };
}

// One request whose handler runs: finish() records its response and
// returns the response to send.
export class Exchange {
  constructor(opts, context, steps) {
    this.opts = opts;
    this.steps = steps;
    this.settled = false;
    const { key, request, token = null, attempt = null, client = null, signal = null } = context;
    this.context = {
      key, request, token, attempt, client, signal,
      // Fences a transaction of the handler's own (claim mode).
      fence: (other) => other.query(ASSERT_OWNER, [key, token, opts.scope]),
    };
  }

  async finish(response) {
    if (this.settled) return response;
    this.settled = true;
    const kind = this.opts.classify(response);
    const stored = encodeResponse(response);
    try {
      if (kind === 'complete') await this.steps.complete(stored);
      else await this.steps.fail(kind === 'final' ? JSON.stringify(stored) : `HTTP ${response.status}`, kind !== 'final');
    } catch (err) {
      // IK001: the lease was lost and another request holds the key; this
      // response is still the truth about the work this request did.
      if (err.code !== 'IK001') return problem(500, 'Internal error', 'The response could not be recorded.');
    }
    return response;
  }

  // The handler ended without a response (an error, a closed connection).
  async abort(error) {
    if (this.settled) return;
    this.settled = true;
    if (this.opts.mode === 'claim') await this.steps.fail(String(error?.message ?? error ?? 'aborted'), true).catch(() => {});
    else await this.steps.discard().catch(() => {});
  }
}
