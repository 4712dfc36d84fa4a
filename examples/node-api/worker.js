// The payment worker: takes payment jobs from the outbox (topic
// payments.charge) and applies each one once in effect, although the outbox
// hands jobs out at least once (the job of a worker that died is handed out
// again when its lease ends).
//
// For each job:
//  1. idem_claim the job's idempotency key. `claimed`: do the work. A job
//     that is already `completed` or `failed` is a redelivery: ack it.
//  2. idem_lock the account, a lease lock with a fencing token: the core
//     bank takes one operation per account at a time, and the balance check,
//     the bank call and the debit of one payment must not interleave with
//     another payment of the same account, in this process or another.
//  3. Call the bank (slow) while a heartbeat renews the key's lease
//     (idem_heartbeat) and the lock's (idem_lock_renew).
//  4. In one transaction: the fences (idem_lock_assert, idem_assert_owner),
//     the debit, the payment row, and idem_complete with the result that the
//     API replays to the client. A worker whose lease ran out and was taken
//     over fails a fence and rolls back instead of debiting twice.
//  5. Ack the job; unlock the account.
//
// Settings (environment): WORKER_NAME, CONCURRENCY (jobs at once, 2),
// LEASE_SECONDS (key and lock leases, 10; heartbeat every quarter of it),
// LOCK_WAIT_SECONDS (5), JOB_LEASE_SECONDS (the outbox lease, 60), POLL_MS
// (1000, the fallback when no notification arrives), and PG* for the database.
import pg from 'pg';
import { pool, transaction } from './db.js';
import { debit } from './bank.js';
import { SCOPE, TOPIC } from './route.js';

const NAME = process.env.WORKER_NAME ?? `worker-${process.pid}`;
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 2);
const LEASE_SECONDS = Number(process.env.LEASE_SECONDS ?? 10);
const LEASE = `${LEASE_SECONDS} seconds`;
const HEARTBEAT_MS = (LEASE_SECONDS * 1000) / 4;
const LOCK_WAIT = `${Number(process.env.LOCK_WAIT_SECONDS ?? 5)} seconds`;
const JOB_LEASE = `${Number(process.env.JOB_LEASE_SECONDS ?? 60)} seconds`;
const POLL_MS = Number(process.env.POLL_MS ?? 1000);

const log = (...args) => console.log(`[${NAME}]`, ...args);

async function one(sql, params) {
  const { rows } = await pool.query(sql, params);
  return rows[0];
}

async function ack(job) {
  await pool.query('SELECT idempotency.outbox_ack(ARRAY[$1::bigint])', [job.id]);
}

// Back to the queue: retried after retrySeconds (or the outbox's backoff),
// or dead-lettered when not retryable.
async function nack(job, error, retryable, retrySeconds = null) {
  await pool.query(
    `SELECT idempotency.outbox_nack($1, $2, retryable => $3,
                                    retry_in => make_interval(secs => $4::float8))`,
    [job.id, error, retryable, retrySeconds === null ? null : Math.max(0, retrySeconds)]);
}

async function handle(job) {
  const { key, request } = job.payload;
  const claim = await one(
    `SELECT outcome, token, error, extract(epoch FROM retry_after)::float8 AS retry_after
       FROM idempotency.idem_claim($1, $2, lease => $3::interval, scope => $4)`,
    [key, request, LEASE, SCOPE]);
  switch (claim.outcome) {
    case 'claimed':
      break;
    case 'completed':
    case 'failed':
      log(`${key}: redelivered, already ${claim.outcome}; acked`);
      return ack(job);
    case 'in_progress':
    case 'retry_later':
      return nack(job, `key ${claim.outcome}`, true, claim.retry_after);
    default: // mismatch: the job does not carry the request its key was registered with
      return nack(job, `key ${claim.outcome}`, false);
  }

  const resource = `account:${request.account}`;
  const { token: lockToken } = await one(
    'SELECT idempotency.idem_lock($1, $2::interval, owner => $3, wait => $4::interval) AS token',
    [resource, LEASE, NAME, LOCK_WAIT]);
  if (lockToken === null) {
    // The account stayed busy: give the claim back (it does not count as an
    // attempt) and let the job come back a little later.
    await pool.query('SELECT idempotency.idem_release($1, $2, scope => $3)', [key, claim.token, SCOPE]);
    return nack(job, `${resource} busy`, true, 1);
  }
  try {
    await pay(key, claim.token, request, resource, lockToken);
    await ack(job);
  } catch (err) {
    if (err.code === 'IK001') {
      // Fenced: a lease ran out. If the key is still ours (we lost only the
      // lock), give it back and retry soon; if someone claimed it since, that
      // worker holds the job's redelivered event and finishes the job.
      log(`${key}: fenced (${err.message})`);
      const released = await pool
        .query('SELECT idempotency.idem_release($1, $2, scope => $3)', [key, claim.token, SCOPE])
        .then(() => true, () => false);
      if (released) await nack(job, err.message, true, 1);
      return;
    }
    // Anything else (the bank, the database) is transient: record it on the
    // key and bring the job back when the key's backoff has passed; after
    // idempotency.max_attempts the key is FAILED_FINAL and the job dead.
    log(`${key}: attempt failed: ${err.message}`);
    const { status, retry_in } = await transaction(async (client) => {
      const { rows: [failed] } = await client.query(
        'SELECT idempotency.idem_fail($1, $2, $3, scope => $4) AS status', [key, claim.token, err.message, SCOPE]);
      const { rows: [due] } = await client.query(
        `SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 AS retry_in
           FROM idempotency.idem_get($1, $2)`, [key, SCOPE]);
      return { status: failed.status, retry_in: due.retry_in };
    });
    await nack(job, err.message, status === 'FAILED_RETRYABLE', retry_in);
  } finally {
    await pool.query('SELECT idempotency.idem_unlock($1, $2)', [resource, lockToken]).catch(() => {});
  }
}

async function pay(key, token, { account, amount }, resource, lockToken) {
  // Every payment of this account runs under its lock, so the balance read
  // here cannot change before the debit below.
  const row = await one('SELECT balance, clock_timestamp() AS now FROM accounts WHERE id = $1', [account]);
  const refusal = !row ? 'unknown_account' :
    Number(row.balance) < amount ? `insufficient_funds: balance ${row.balance} < amount ${amount}` : null;
  if (refusal) {
    // A final failure: the API replays it (402) and the job is not retried.
    await pool.query('SELECT idempotency.idem_fail($1, $2, $3, retryable => false, scope => $4)',
      [key, token, refusal, SCOPE]);
    log(`${key}: refused (${refusal})`);
    return;
  }

  const heartbeat = new Heartbeat(key, token, resource, lockToken);
  let bank;
  try {
    bank = await debit(account, amount, key);
  } finally {
    await heartbeat.stop();
  }
  heartbeat.throwIfLost();

  const result = await transaction(async (client) => {
    // Fences before the writes: IK001, and a rollback, unless this worker
    // still holds the account's lock and the key's current token.
    await client.query('SELECT idempotency.idem_lock_assert($1, $2)', [resource, lockToken]);
    await client.query('SELECT idempotency.idem_assert_owner($1, $2, scope => $3)', [key, token, SCOPE]);
    const { rows: [debited] } = await client.query(
      'UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance', [account, amount]);
    const { rows: [payment] } = await client.query(
      `INSERT INTO payments (idempotency_key, account, amount, worker, started_at)
       VALUES ($1, $2, $3, $4, $5) RETURNING id`,
      [key, account, amount, NAME, row.now]);
    const stored = {
      payment_id: Number(payment.id),
      account,
      amount,
      balance_after: Number(debited.balance),
      bank_ref: bank.bank_ref,
    };
    await client.query('SELECT idempotency.idem_complete($1, $2, $3, scope => $4)', [key, token, stored, SCOPE]);
    return stored;
  });
  log(`${key}: paid ${amount} from ${account} (payment ${result.payment_id})`);
}

// Renews the key's lease and the account lock's every HEARTBEAT_MS while
// the slow call runs. A renewal that finds the lease gone (IK001, or the
// lock no longer held) is remembered; the fences at the end make it final.
class Heartbeat {
  constructor(key, token, resource, lockToken) {
    this.lost = null;
    this.beat = Promise.resolve();
    this.timer = setInterval(() => {
      this.beat = this.beat.then(() => this.renew(key, token, resource, lockToken));
    }, HEARTBEAT_MS);
  }

  async renew(key, token, resource, lockToken) {
    if (this.lost) return;
    try {
      // One round trip for both leases.
      const { lock_held } = await one(
        `SELECT idempotency.idem_heartbeat($1, $2, $3::interval, scope => $4) AS lease_until,
                idempotency.idem_lock_renew($5, $6, $3::interval) AS lock_held`,
        [key, token, LEASE, SCOPE, resource, lockToken]);
      if (!lock_held) this.lost = `the lock on ${resource}`;
    } catch (err) {
      if (err.code === 'IK001') this.lost = `the key ${key}`;
      else log(`${key}: heartbeat failed: ${err.message}`); // transient; the next beat tries again
    }
  }

  async stop() {
    clearInterval(this.timer);
    await this.beat;
  }

  throwIfLost() {
    if (!this.lost) return;
    throw Object.assign(new Error(`lost ${this.lost}`), { code: 'IK001' });
  }
}

// ---------------------------------------------------------------- the loop

let stopping = false;
const sleepers = new Set();

// Waits up to ms, or until a job is enqueued (NOTIFY) or the worker stops.
function idle(ms) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      sleepers.delete(done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    sleepers.add(done);
  });
}
const wakeAll = () => [...sleepers].forEach((done) => done());

async function loop(slot) {
  const relay = `${NAME}/${slot}`;
  while (!stopping) {
    try {
      // One job at a time per slot: a bigger batch would hold jobs in flight
      // that another worker could be running.
      const { rows } = await pool.query(
        `SELECT id, payload, attempt
           FROM idempotency.outbox_claim($1, batch => 1, lease => $2::interval, topics => ARRAY[$3])`,
        [relay, JOB_LEASE, TOPIC]);
      if (rows.length === 0) await idle(POLL_MS);
      else await handle(rows[0]);
    } catch (err) {
      // The job, if any, is handed out again when its lease ends.
      console.error(`[${relay}]`, err.message);
      await idle(POLL_MS);
    }
  }
}

async function listen() {
  const client = new pg.Client({ application_name: `${NAME} listener` });
  client.on('error', (err) => console.error(`[${NAME}] listener: ${err.message}; polling only`));
  client.on('notification', wakeAll);
  await client.connect();
  await client.query('LISTEN idempotency_outbox');
  return client;
}

const listener = await listen();
const loops = Array.from({ length: CONCURRENCY }, (_, slot) => loop(slot));
log(`started: ${CONCURRENCY} slots, lease ${LEASE}`);

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    log('stopping after the jobs in hand');
    wakeAll();
    await Promise.all(loops);
    await listener.end().catch(() => {});
    await pool.end();
    process.exit(0);
  });
}
