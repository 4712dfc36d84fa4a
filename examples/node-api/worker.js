// The payment worker: takes jobs from the outbox (consume) and applies each
// payment once in effect (claim), although jobs are handed out at least once.
// Per job, under the key's claim (its lease renewed by the client's heartbeat):
//  1. a lease lock on the account (idem_lock): the balance check, the slow
//     bank call and the debit never interleave with another payment of the
//     account, in any process; a busy account gives the key back (release);
//  2. a balance too low is a final failure (FinalError), replayed as 402;
//  3. the bank call (bank.js), then in one transaction: the lock's fence, the
//     key's fence (job.transaction), the debit, the payment row and the
//     result. A worker whose lease was taken over is fenced and rolls back.
// Settings (environment): WORKER_NAME, CONCURRENCY (2), LEASE_SECONDS (the
// key's lease, 10), LOCK_TTL_SECONDS (30), LOCK_WAIT_SECONDS (5),
// JOB_LEASE_SECONDS (the outbox lease, 60), POLL_MS (1000), and PG*.
import { FinalError, claim, consume } from 'pg-idempotency';
import { debit } from './bank.js';
import { SCOPE, TOPIC, newPool } from './payments.js';

const env = (name, fallback) => Number(process.env[name] ?? fallback);
const NAME = process.env.WORKER_NAME ?? `worker-${process.pid}`;
const pool = newPool(NAME);

async function pay(job, { account, amount }) {
  const resource = `account:${account}`;
  const { rows: [{ lock }] } = await pool.query(
    'SELECT idempotency.idem_lock($1, make_interval(secs => $2), owner => $3, wait => make_interval(secs => $4)) AS lock',
    [resource, env('LOCK_TTL_SECONDS', 30), NAME, env('LOCK_WAIT_SECONDS', 5)]);
  if (lock === null) return job.release();   // the account stayed busy: the job comes back
  try {
    const { rows: [row] } = await pool.query('SELECT balance, clock_timestamp() AS now FROM accounts WHERE id = $1', [account]);
    if (!row) throw new FinalError('unknown_account');
    if (Number(row.balance) < amount) throw new FinalError(`insufficient_funds: balance ${row.balance} < amount ${amount}`);
    const { bank_ref } = await debit(account, amount, job.key);
    const result = await job.transaction(async (client) => {
      await client.query('SELECT idempotency.idem_lock_assert($1, $2)', [resource, lock]);
      const { rows: [debited] } = await client.query(
        'UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance', [account, amount]);
      const { rows: [payment] } = await client.query(
        `INSERT INTO payments (idempotency_key, account, amount, worker, started_at)
         VALUES ($1, $2, $3, $4, $5) RETURNING id`, [job.key, account, amount, NAME, row.now]);
      return { payment_id: Number(payment.id), account, amount, balance_after: Number(debited.balance), bank_ref };
    });
    console.log(`[${NAME}] ${job.key}: paid ${amount} from ${account} (payment ${result.payment_id})`);
    return result;
  } finally {
    await pool.query('SELECT idempotency.idem_unlock($1, $2)', [resource, lock]).catch(() => {});
  }
}

const consumer = consume(pool, {
  topics: TOPIC, name: NAME, concurrency: env('CONCURRENCY', 2),
  lease: env('JOB_LEASE_SECONDS', 60), pollInterval: env('POLL_MS', 1000) / 1000,
}, async ({ payload: { key, request, payment } }) => {
  const outcome = await claim(pool, { key, request, scope: SCOPE, lease: env('LEASE_SECONDS', 10) }, (job) => pay(job, payment));
  if (outcome.outcome !== 'completed' || outcome.replayed) console.log(`[${NAME}] ${key}: ${outcome.outcome} ${outcome.error ?? ''}`);
  return outcome;
});
console.log(`[${NAME}] started`);

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, async () => {
    await consumer.stop();   // after the jobs in hand
    await pool.end();
    process.exit(0);
  });
}
