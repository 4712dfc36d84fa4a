// Multi-step work (docs/keys.md, "Multi-step work"): each finished step is
// recorded on the key with idem_step, in the transaction of the step's own
// writes; a claim that resumes the key is given the finished steps, and
// step() returns a finished step's stored result instead of running it.
import { createHash } from 'node:crypto';
import { FinalError, UnstorableResult } from './errors.js';
import { ASSERT_OWNER, STEP, storable } from './sql.js';
import { withTransaction } from './transaction.js';

// The finished steps of a claim's answer (an object name -> { n, attempt,
// result }) as a Map in the order they finished.
export function parseSteps(steps) {
  const entries = Object.entries(steps ?? {}).sort(([, a], [, b]) => a.n - b.n);
  return new Map(entries.map(([name, { n, attempt, result }]) => [name, { n, attempt, result }]));
}

// A step's name as idem_step takes it: 1 to 63 bytes of ASCII letters,
// digits and _ . : - (it is part of the step's key, which providers
// receive in a header). Checked before the step runs: a name the server
// refuses would fail the key at every attempt, after the step's work.
const STEP_NAME = /^[A-Za-z0-9_.:-]{1,63}$/;

function checkStepName(name) {
  if (typeof name !== 'string' || !STEP_NAME.test(name)) {
    throw new FinalError(`idempotency: a step's name is 1 to 63 ASCII letters, digits and _ . : -, not ${JSON.stringify(name)}`);
  }
}

// The key of a step's external call, to give the provider as its own
// idempotency key: the same text idem_step_key(key, step, scope) returns,
// computed here without a round trip (the step's name, a dash, and the
// first 128 bits of the SHA-256 of scope, key and step, each preceded by
// its length in bytes and a colon).
export function stepKey(scope, key, step) {
  checkStepName(step);
  const hash = createHash('sha256');
  for (const part of [scope, key, step]) {
    const bytes = Buffer.from(part, 'utf8');
    hash.update(`${bytes.length}:`);
    hash.update(bytes);
  }
  return `${step}-${hash.digest('hex').slice(0, 32)}`;
}

// The steps running now, by holder: a call of a step's name while that
// step runs (in parallel) takes its result instead of running fn again.
const running = new WeakMap();

// Runs the step `name` of the key held under `token`, unless it finished:
// fn(client, { key }) in a transaction (on `client` when one is given, the
// caller's, else one of the pool's), then its record in that transaction.
// Resolves to the step's result, the stored one when it had finished.
export async function runStep(holder, name, fn) {
  if (holder.steps.has(name)) return holder.steps.get(name).result;
  let now = running.get(holder);
  if (!now) running.set(holder, now = new Map());
  if (now.has(name)) return now.get(name);
  const step = runNewStep(holder, name, fn);
  now.set(name, step);
  try {
    return await step;
  } finally {
    now.delete(name);
  }
}

async function runNewStep(holder, name, fn) {
  const { pool, client = null, key, token, scope, steps } = holder;
  const record = async (tx) => {
    // The key must still be this claim's before the step's work: a worker
    // paused past its lease, whose key another took over and finished,
    // would run again a step that one finished (fenced only at its record).
    await tx.query(ASSERT_OWNER, [key, token, scope]);
    const result = (await fn(tx, { key: stepKey(scope, key, name) })) ?? null;
    const { rows: [{ n }] } = await tx.query(STEP, [key, token, name, storable(result), scope]).catch((err) => {
      // 22001: larger than idempotency.max_step_bytes; 54000: the key holds
      // idempotency.max_steps steps. Like a result that is not JSON, it
      // would be so at every attempt, after the step's work.
      if (err.code === '22001') throw new UnstorableResult(err, 'the step\'s result cannot be stored');
      if (err.code === '54000') throw new UnstorableResult(err, 'the step cannot be recorded');
      throw err;
    });
    return { n, result };
  };
  const done = client ? await record(client) : await withTransaction(pool, record);
  steps.set(name, { n: done.n, attempt: holder.attempt, result: done.result });
  return done.result;
}
