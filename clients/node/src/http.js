// The Idempotency-Key header, independent of any framework: what to answer
// before the handler runs, and what to record once it has answered.
// express.js and fastify.js adapt it.
//
//   no key, required              400
//   in progress / retry later     409 with Retry-After (or wait up to `wait`)
//   key reused, another request   422
//   done                          the stored response, Idempotent-Replayed: true
//   done, its response expired    410 (only the key's tombstone is left: the
//                                 handler does not run again)
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
import { MAX_RETRY_IN, UnstorableResult, classifyOr, errorText } from './errors.js';
import { callHook } from './hooks.js';
import { decodeResponse, encodeResponse, isStoredResponse, jsonResponse, problem, response, storedFailure } from './response.js';
import { retryLost } from './record.js';
import { ASSERT_OWNER, CLAIM, COMPLETE, FAIL, REGISTER, RELEASE, jsonParam } from './sql.js';
import { claimWhileOpen, isClosing, track } from './state.js';
import { checkOut } from './transaction.js';
import { checkSeconds, given } from './options.js';
import { parseSteps, runStep, stepKey } from './steps.js';
import { claimWaiting, groupId } from './wait.js';

const MODES = new Set(['claim', 'transaction', 'register']);
// A response the server cannot store (idempotency.max_value_bytes) fails
// its key with this message.
const TOO_LARGE = 'the response is larger than the server stores (idempotency.max_value_bytes)';

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
    expiredResponse: expiredProblem,
    onReplay: null,
    onConflict: null,
    onMismatch: null,
    onFenced: null,
    onError: (event) => console.error(`idempotency: key ${JSON.stringify(event.key)}: ${event.during}:`, event.error),
    ...given(options),
  };
  if (typeof opts.pool?.query !== 'function') throw new TypeError('idempotency: the pool option (a pg Pool) is required');
  if (!MODES.has(opts.mode)) throw new TypeError(`idempotency: unknown mode ${opts.mode}`);
  checkSeconds('lease', opts.lease, { positive: true });
  checkSeconds('wait', opts.wait);
  checkSeconds('retryIn', opts.retryIn, { most: MAX_RETRY_IN });
  for (const name of ['fingerprint', 'classify', 'completedResponse', 'failedResponse', 'expiredResponse']) {
    if (typeof opts[name] !== 'function') throw new TypeError(`idempotency: ${name} must be a function`);
  }
  // A hook that is not a function was ignored, and its logging lost.
  for (const name of ['onReplay', 'onConflict', 'onMismatch', 'onFenced', 'onError']) {
    if (opts[name] != null && typeof opts[name] !== 'function') throw new TypeError(`idempotency: ${name} must be a function`);
  }
  for (const name of ['header', 'replayHeader', 'scope']) {
    if (typeof opts[name] !== 'string' || opts[name] === '') throw new TypeError(`idempotency: ${name} must be a non-empty string`);
  }
  // A header's name is an HTTP token: no request could carry another, and
  // a replay could not send it.
  for (const name of ['header', 'replayHeader']) {
    if (!HTTP_TOKEN.test(opts[name])) throw new TypeError(`idempotency: ${name} must be an HTTP header name, not ${JSON.stringify(opts[name])}`);
  }
  if (Buffer.byteLength(opts.scope) > 63 || !opts.scope.isWellFormed()) {
    throw new TypeError(`idempotency: scope must be at most 63 bytes of UTF-8, not ${JSON.stringify(opts.scope)}`);
  }
  if (!Array.isArray(opts.methods) || !opts.methods.every((m) => typeof m === 'string')) {
    throw new TypeError("idempotency: methods must be an array of HTTP methods, such as ['POST']");
  }
  opts.methods = opts.methods.map((m) => m.toUpperCase());
  return opts;
}

// RFC 9110's token: the characters of a header's name.
const HTTP_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

// Retry-After of a 409: the seconds idem_claim said (for in_progress, the
// extension's estimate of when the holder is done; for retry_later, the
// backoff left), rounded up, at least 1.
export function retryAfterSeconds(row) {
  const seconds = Number(row.retry_after);
  return String(Number.isFinite(seconds) ? Math.max(1, Math.ceil(seconds)) : 1);
}

// A replay: the stored response (or what a hook made of the key's state).
function replay(opts, { status, headers, body }) {
  return response(status, { ...headers, [opts.replayHeader.toLowerCase()]: 'true' }, body);
}

// 410 Gone: the request was processed, but its stored response has passed
// its retention; only the key's tombstone is left (RFC 9457 problem
// document, with the key as a member of its own).
export function expiredProblem(key) {
  return response(410, { 'content-type': 'application/problem+json' }, JSON.stringify({
    title: 'Idempotent response expired',
    status: 410,
    detail: `The request with Idempotency-Key "${key}" was already processed; its stored response has expired and cannot be replayed.`,
    idempotency_key: key,
  }));
}

// The response a key's settled state is answered with; the hooks hear of it.
function answer(opts, key, row) {
  const event = { key, scope: opts.scope, mode: opts.mode, outcome: row.outcome };
  if (row.result_expired && (row.outcome === 'completed' || row.outcome === 'failed')) {
    const sent = opts.expiredResponse(key, row);
    callHook(opts.onReplay, { ...event, status: sent.status, resultExpired: true });
    return sent;
  }
  switch (row.outcome) {
    case 'completed': {
      const sent = replay(opts, isStoredResponse(row.result) ? decodeResponse(row.result) : opts.completedResponse(row.result));
      callHook(opts.onReplay, { ...event, status: sent.status });
      return sent;
    }
    case 'failed': {
      const stored = storedFailure(row.error);
      const sent = replay(opts, stored ? decodeResponse(stored) : opts.failedResponse(row.error));
      callHook(opts.onReplay, { ...event, status: sent.status });
      return sent;
    }
    case 'mismatch':
      callHook(opts.onMismatch, { ...event, status: 422 });
      return problem(422, 'Idempotency-Key reused',
        'This Idempotency-Key was already used with a different request.');
    default: { // in_progress, retry_later
      const retryAfter = retryAfterSeconds(row);
      callHook(opts.onConflict, { ...event, status: 409, retryAfter: Number(retryAfter) });
      return problem(409, 'Request in progress',
        'A request with this Idempotency-Key is being processed; retry later.',
        { 'retry-after': retryAfter });
    }
  }
}

const stopping = () => problem(503, 'Server shutting down', 'The server is stopping; retry the request.',
  { 'retry-after': '1' });

// A header's value as Node reads it (each byte a character, latin-1) read
// as the UTF-8 its bytes are, so that a key is the same characters a
// worker, or the Go client, would use for it; null when they are not UTF-8.
function headerText(value) {
  if (typeof value !== 'string' || !/[\x80-\xff]/.test(value) || /[^\x00-\xff]/.test(value)) return value;
  const bytes = Buffer.from(value, 'latin1');
  const text = bytes.toString('utf8');
  return Buffer.from(text, 'utf8').equals(bytes) ? text : null;
}

// begin(opts, { method, key, path, body, signal }) resolves to { response }
// to send now, or { exchange } when the handler is to run (pass it the
// context, then call exchange.finish(response) or exchange.abort(error);
// exchange.disconnect() when the client went away), or {} when the request
// does not take part (method not covered, optional key absent). `signal`
// aborts a wait when the client goes away.
export async function begin(opts, { method, key: header, path, body, signal = null }) {
  if (!opts.methods.includes(method)) return {};
  const key = headerText(header);
  if (key === null) return { response: problem(400, 'Idempotency-Key is not UTF-8', 'A key is UTF-8 text.') };
  if (!key) {
    if (!opts.required) return {};
    return { response: problem(400, 'Idempotency-Key is missing', `This request requires an ${opts.header} header.`) };
  }
  if (Buffer.byteLength(key) > 255) {
    return { response: problem(400, 'Idempotency-Key is too long', 'At most 255 bytes.') };
  }
  if (isClosing(opts.pool)) return { response: stopping() };
  const request = opts.fingerprint({ method, path, body });
  if (opts.mode === 'claim') return beginClaim(opts, key, request, signal);
  return beginInTransaction(opts, key, request, signal);
}

async function beginClaim(opts, key, request, signal) {
  const { pool } = opts;
  const params = [key, jsonParam(request), opts.lease, opts.scope, null];
  const { row } = await claimWaiting(pool, {
    id: groupId('claim', opts.scope, key, request, opts.lease),
    wait: opts.wait,
    signal,
    attempt: async () => {
      const giveBack = (claimed) => pool.query(RELEASE, [key, claimed.token, opts.scope]);
      const claimed = await claimWhileOpen(pool, async () => (await pool.query(CLAIM, params)).rows[0], giveBack);
      return { row: claimed, abandon: () => giveBack(claimed) };
    },
  });
  if (row.outcome !== 'claimed') return { response: answer(opts, key, row) };
  const beat = new Heartbeat(pool, { key, token: row.token, scope: opts.scope, lease: opts.lease });
  // Tried again after a lost connection (record.js).
  // The heartbeat goes on while the response is recorded: a record that
  // waits for a busy pool must not let the lease end, or a duplicate takes
  // the key over and runs the handler again.
  const record = async (sql, params, statuses) => {
    beat.recording = true;
    try {
      await retryLost(pool, { key, token: row.token, scope: opts.scope, get leaseEnds() { return beat.leaseEnds; } },
        () => pool.query(sql, params), statuses, () => null);
    } finally {
      await beat.stop();
    }
  };
  return {
    exchange: new Exchange(opts, { key, request, token: row.token, attempt: row.attempt, heartbeat: beat, steps: row.steps }, {
      complete: (stored) => record(COMPLETE, [key, row.token, jsonParam(stored), opts.scope], ['COMPLETED']),
      fail: (error, retryable) => record(FAIL, [key, row.token, error, retryable, retryable ? opts.retryIn : null, opts.scope],
        ['FAILED_RETRYABLE', 'FAILED_FINAL']),
      discard: () => beat.stop(),
      // Shutdown: the key goes back (not an attempt), the retry runs anew.
      stop: async () => {
        await beat.stop();
        await pool.query(RELEASE, [key, row.token, opts.scope]).catch(() => {});
      },
    }),
  };
}

// One try of a transaction-mode or register-mode key: BEGIN and the claim
// (or register) on a connection of the pool. When the key is ours the
// transaction stays open for the handler; otherwise it commits (nothing
// was written) and the connection goes back to the pool.
async function tryInTransaction(opts, key, request) {
  const { client, release } = await checkOut(opts.pool);
  let row;
  try {
    await client.query('BEGIN');
    ({ rows: [row] } = opts.mode === 'register'
      ? await client.query(REGISTER, [key, jsonParam(request), key, opts.scope])
      : await client.query(CLAIM, [key, jsonParam(request), opts.lease, opts.scope, null]));
    if (row.outcome === 'registered' || row.outcome === 'claimed') {
      await client.query('SAVEPOINT idempotent_handler');
    } else {
      await client.query('COMMIT');
    }
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    release();
    throw err;
  }
  if (row.outcome !== 'registered' && row.outcome !== 'claimed') {
    release();
    return { row };
  }
  return {
    row,
    client,
    release,
    abandon: async () => {
      try {
        await client.query('ROLLBACK');
      } finally {
        release();
      }
    },
  };
}

async function beginInTransaction(opts, key, request, signal) {
  const { row, client, release } = await claimWaiting(opts.pool, {
    id: groupId(opts.mode, opts.scope, key, request, opts.lease),
    wait: opts.mode === 'register' ? 0 : opts.wait,
    signal,
    attempt: () => tryInTransaction(opts, key, request),
  });
  if (row.outcome !== 'registered' && row.outcome !== 'claimed') return { response: answer(opts, key, row) };
  let released = false;
  const end = async (sql) => {
    if (released) return;
    try {
      await client.query(sql);
    } finally {
      released = true;
      release();
    }
  };
  const context = { key, request, token: row.token, attempt: row.attempt, client, steps: row.steps };
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
      // Shutdown: the connection is closed (not returned): the server rolls
      // the transaction back at once, even while a statement of the handler
      // still runs on it, and the key never existed.
      stop: async () => {
        if (released) return;
        released = true;
        client.release(new Error('idempotency: the server is shutting down'));
      },
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
    this.unstorable = null;   // a step's result that could not be stored
    const { key, request, token = null, attempt = null, client = null, heartbeat = null } = context;
    // Multi-step handlers: the steps an earlier attempt finished, and
    // step(name, fn) as a worker's job has it (steps.js): in claim mode in
    // a transaction of its own, in transaction mode on the request's.
    const holder = { pool: opts.pool, client, key, token, scope: opts.scope, attempt, steps: parseSteps(context.steps) };
    this.key = key;
    this.heartbeat = heartbeat;
    // Aborted when the lease is lost, the client went away, or a shutdown
    // ended the request.
    this.controller = new AbortController();
    heartbeat?.signal.addEventListener('abort', () => {
      callHook(opts.onFenced, { key, scope: opts.scope, mode: opts.mode, error: String(heartbeat.lost?.message ?? 'lease lost'), during: 'heartbeat' });
      this.controller.abort(heartbeat.signal.reason);
    }, { once: true });
    this.context = {
      key, request, token, attempt, client, signal: this.controller.signal,
      // Fences a transaction of the handler's own (claim mode).
      fence: (other) => other.query(ASSERT_OWNER, [key, token, opts.scope]),
      steps: holder.steps,
      step: async (name, fn) => {
        if (token === null) throw new Error('idempotency: steps need a claimed key (claim or transaction mode)');
        try {
          return await runStep(holder, name, fn);
        } catch (err) {
          // A step's result that cannot be stored would be so at every
          // attempt, after the step's work: the key fails for good, whatever
          // response the application makes of the error.
          if (err instanceof UnstorableResult) this.unstorable = err;
          throw err;
        }
      },
      stepKey: (name) => stepKey(opts.scope, key, name),
    };
    let done;
    this.owner = {
      settled: new Promise((resolve) => { done = resolve; }),
      stop: (reason) => this.stop(reason),
    };
    this.untrack = track(opts.pool, this.owner);
    this.done = () => {
      this.untrack();
      done();
    };
  }

  async finish(response) {
    if (this.settled) return response;
    this.settled = true;
    try {
      const kind = this.unstorable ? 'final'
        : classifyOr(this.opts.classify, defaultClassify, response, (err) => this.reportError(err, 'classify'));
      const stored = encodeResponse(response);
      if (kind === 'complete') await this.steps.complete(stored);
      else await this.steps.fail(kind === 'final' ? JSON.stringify(stored) : `HTTP ${response.status}`, kind !== 'final');
    } catch (err) {
      // 22001: larger than the server stores (idempotency.max_value_bytes).
      // Left held, the key would run the handler again at each lease's end:
      // it fails for good instead, and this client gets what a retry will.
      if (err.code === '22001' && this.opts.mode === 'claim') return this.failTooLarge();
      // IK001: the lease was lost and another request holds the key; this
      // response is still the truth about the work this request did.
      if (err.code !== 'IK001') {
        this.reportError(err, 'record');
        return problem(500, 'Internal error', 'The response could not be recorded.');
      }
      callHook(this.opts.onFenced, { key: this.key, scope: this.opts.scope, mode: this.opts.mode, error: err.message, during: 'record' });
    } finally {
      this.done();
    }
    return response;
  }

  reportError(error, during) {
    callHook(this.opts.onError, { key: this.key, scope: this.opts.scope, mode: this.opts.mode, error, during });
  }

  async failTooLarge() {
    try {
      await this.steps.fail(TOO_LARGE, false);
    } catch (err) {
      this.reportError(err, 'record');
      return problem(500, 'Internal error', 'The response could not be recorded.');
    }
    return this.opts.failedResponse(TOO_LARGE);
  }

  // The handler ended without a response (an error, a closed connection).
  async abort(error) {
    if (this.settled) return;
    this.settled = true;
    try {
      if (this.opts.mode === 'claim') await this.steps.fail(errorText(error, 'aborted'), !this.unstorable).catch(() => {});
      else await this.steps.discard().catch(() => {});
    } finally {
      this.done();
    }
  }

  // The client went away while the handler runs: its signal is aborted and
  // the heartbeat stops. A response the handler still produces is recorded
  // if the key is still its own; otherwise the lease ends and a retry takes
  // the key over.
  disconnect() {
    if (this.settled) return;
    this.controller.abort(new Error('the client closed the connection'));
    this.heartbeat?.stop();
  }

  // Shutdown after its timeout: the handler's signal is aborted and the
  // key given back, so that it is not left PROCESSING with a live heartbeat.
  async stop(reason) {
    if (this.settled) return;
    this.settled = true;
    this.controller.abort(reason);
    try {
      await this.steps.stop();
    } finally {
      this.done();
    }
  }
}
