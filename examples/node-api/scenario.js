// The checks run by check.sh against the API and the workers it started:
// HTTP answers first, then the state of the database. Prints one line per
// check ("ok ..." / "not ok ...") and exits 1 if any failed.
//   API_URL   the payments endpoint, e.g. http://127.0.0.1:PORT/api/payments
//   PG*       the database (the checks read it as PGADMIN_USER, a superuser)
import pg from 'pg';

const API_URL = process.env.API_URL;
const DEADLINE_MS = 90_000;
const started = Date.now();
let failures = 0;

function check(name, ok, detail = '') {
  console.log(`${ok ? 'ok' : 'not ok'} - ${name}${!ok && detail ? `\n    ${detail}` : ''}`);
  if (!ok) failures += 1;
}

async function post(key, body, { raw = false } = {}) {
  const headers = { 'Content-Type': 'application/json' };
  if (key !== null) headers['Idempotency-Key'] = key;
  const res = await fetch(API_URL, { method: 'POST', headers, body: raw ? body : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: text ? JSON.parse(text) : null };
}

const statuses = (answers) => answers.map((a) => a.status).sort().join(',');

// ------------------------------------------------------------ bad requests
{
  const noKey = await post(null, { account: 'acct-a', amount: 100 });
  check('no Idempotency-Key header: 400 with a problem document', noKey.status === 400 &&
    noKey.headers.get('content-type') === 'application/problem+json', `${noKey.status} ${noKey.text}`);
  const notJson = await post('bad-1', '{"account": ', { raw: true });
  check('a body that is not JSON: 400', notJson.status === 400, `${notJson.status} ${notJson.text}`);
  const badAmount = await post('bad-2', { account: 'acct-a', amount: -5 });
  check('an invalid payment: 400', badAmount.status === 400, `${badAmount.status} ${badAmount.text}`);
}

// ------------------------------------------------------------ concurrent duplicates
// The same request, sent 8 times at once (a client retrying on timeouts, a
// double submit): exactly one is accepted, the others are told it is in
// progress. slow-c's bank takes 3 s, so none of them can see it finished.
const slowKey = 'pay-slow-1';
const slowBody = { account: 'slow-c', amount: 700 };
{
  const answers = await Promise.all(Array.from({ length: 8 }, () => post(slowKey, slowBody)));
  const accepted = answers.filter((a) => a.status === 202).length;
  const inProgress = answers.filter((a) => a.status === 409);
  check('8 concurrent duplicates: one 202, seven 409', accepted === 1 && inProgress.length === 7, statuses(answers));
  check('every 409 carries Retry-After', inProgress.every((a) => Number(a.headers.get('retry-after')) >= 1));
  const reused = await post(slowKey, { account: 'slow-c', amount: 701 });
  check('the key reused with another body while in progress: 422', reused.status === 422, `${reused.status} ${reused.text}`);
}

// ------------------------------------------------------------ many payments, each sent 3 times
const payments = new Map([[slowKey, slowBody]]);
for (let i = 1; i <= 30; i += 1) payments.set(`pay-${i}`, { account: i % 2 ? 'acct-a' : 'acct-b', amount: 100 + i });
{
  const keys = [...payments.keys()].filter((k) => k !== slowKey);
  const answers = await Promise.all(keys.flatMap((k) => [1, 2, 3].map(() => post(k, payments.get(k)).then((a) => [k, a]))));
  const bad = keys.filter((k) => {
    const mine = answers.filter(([key]) => key === k).map(([, a]) => a.status);
    return mine.filter((s) => s === 202).length !== 1 || !mine.every((s) => [202, 409, 200].includes(s));
  });
  check('30 payments sent 3 times each at once: one 202 per key, the others 409 (or 200 once done)',
    bad.length === 0, `keys: ${bad.join(' ')}`);
}
const poorKey = 'pay-poor-1';
{
  const poor = await post(poorKey, { account: 'acct-poor', amount: 1000 });
  check('a payment the account cannot cover is accepted (202): the worker decides', poor.status === 202, poor.text);
}

// ------------------------------------------------------------ results, replayed
async function settle(key, body) {
  for (;;) {
    const answer = await post(key, body);
    if (answer.status !== 409 || Date.now() - started > DEADLINE_MS) return answer;
    await new Promise((r) => setTimeout(r, 200));
  }
}
{
  const results = new Map();
  const wrong = [];
  for (const [key, body] of payments) {
    const answer = await settle(key, body);
    results.set(key, answer);
    const r = answer.json ?? {};
    if (answer.status !== 200 || r.account !== body.account || r.amount !== body.amount || !r.payment_id) {
      wrong.push(`${key}: ${answer.status} ${answer.text}`);
    }
  }
  check(`every payment completes: 200 with its result (${payments.size})`, wrong.length === 0, wrong.slice(0, 5).join('; '));

  const mismatched = [];
  for (const [key, body] of payments) {
    const again = await post(key, body);
    const first = results.get(key);
    if (again.status !== first.status || again.text !== first.text || again.headers.get('idempotent-replayed') !== 'true') {
      mismatched.push(`${key}: ${again.status} ${again.text}`);
    }
  }
  check('a retry after completion replays the stored response, byte for byte', mismatched.length === 0, mismatched.slice(0, 5).join('; '));

  const poor = await settle(poorKey, { account: 'acct-poor', amount: 1000 });
  check('the refused payment replays 402 with the reason', poor.status === 402 &&
    poor.json?.error?.startsWith('insufficient_funds') && poor.headers.get('idempotent-replayed') === 'true',
    `${poor.status} ${poor.text}`);
  const reused = await post('pay-1', { account: 'acct-a', amount: 999 });
  check('a completed key reused with another body: 422', reused.status === 422, `${reused.status} ${reused.text}`);
}

// ------------------------------------------------------------ the database
const db = new pg.Client({ user: process.env.PGADMIN_USER ?? 'postgres' });
await db.connect();
const q = async (sql, params) => (await db.query(sql, params)).rows;
{
  const perKey = await q('SELECT idempotency_key, count(*)::int AS n FROM payments GROUP BY 1');
  const counts = new Map(perKey.map((r) => [r.idempotency_key, r.n]));
  const twice = perKey.filter((r) => r.n !== 1).map((r) => `${r.idempotency_key}=${r.n}`);
  check('each payment applied exactly once', twice.length === 0 && [...payments.keys()].every((k) => counts.get(k) === 1),
    `applied: ${JSON.stringify(Object.fromEntries(counts))}`);
  check('the refused payment applied not at all', !counts.has(poorKey));

  const expected = { 'acct-a': 1000000, 'acct-b': 1000000, 'slow-c': 1000000, 'acct-poor': 500 };
  for (const body of payments.values()) expected[body.account] -= body.amount;
  const balances = Object.fromEntries((await q('SELECT id, balance::text AS balance FROM accounts')).map((r) => [r.id, Number(r.balance)]));
  check('balances are the opening balances less each payment once', JSON.stringify(balances, Object.keys(expected).sort()) ===
    JSON.stringify(expected, Object.keys(expected).sort()), `got ${JSON.stringify(balances)}, want ${JSON.stringify(expected)}`);

  const [overlap] = await q(`SELECT count(*)::int AS n FROM payments p JOIN payments o
      ON o.account = p.account AND o.id > p.id
     AND tstzrange(o.started_at, o.finished_at) && tstzrange(p.started_at, p.finished_at)`);
  check('the account lock: no two payments of one account ever ran at the same time', overlap.n === 0, `${overlap.n} overlaps`);
  const [workers] = await q('SELECT count(DISTINCT worker)::int AS n FROM payments');
  check('both workers took part', workers.n === 2, `${workers.n} workers`);

  const [keys] = await q(`SELECT count(*)::int AS n, max(attempts) AS max_attempts,
      count(*) FILTER (WHERE status = 'COMPLETED')::int AS completed,
      count(*) FILTER (WHERE status = 'FAILED_FINAL')::int AS failed
     FROM idempotency.idempotency_keys WHERE scope = 'payments'`);
  check('every key claimed once, completed or refused (32 keys, 31 completed, 1 refused, max 1 attempt)',
    keys.n === 32 && keys.completed === 31 && keys.failed === 1 && keys.max_attempts === 1, JSON.stringify(keys));
  const [slow] = await q("SELECT status, attempts FROM idempotency.idem_get('pay-slow-1', 'payments')");
  check('the 3 s payment with a 2 s lease kept its lease by heartbeats (1 attempt)',
    slow.status === 'COMPLETED' && slow.attempts === 1, JSON.stringify(slow));

  const [outbox] = await q(`SELECT count(*)::int AS n, count(*) FILTER (WHERE state = 'delivered')::int AS delivered,
      array_agg(payload->>'key') FILTER (WHERE state = 'dead') AS dead
     FROM idempotency.outbox WHERE topic = 'payments.charge'`);
  check('one job per key in the outbox (32): all delivered but the refused one, a dead letter',
    outbox.n === 32 && outbox.delivered === 31 && JSON.stringify(outbox.dead) === JSON.stringify([poorKey]), JSON.stringify(outbox));

  const [m] = await q('SELECT claims, lease_expirations, stale_tokens, mismatches, locks_acquired, outbox_deduplicated FROM idempotency.idem_metrics');
  check('metrics: 32 claims, no lease expired, no stale token, 2 mismatches, a lock per payment',
    Number(m.claims) === 32 && Number(m.lease_expirations) === 0 && Number(m.stale_tokens) === 0 &&
    Number(m.mismatches) === 2 && Number(m.locks_acquired) === 32, JSON.stringify(m));
}
await db.end();

console.log(failures === 0 ? 'all checks passed' : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
