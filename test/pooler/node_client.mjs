// The Node client through a pooler in transaction mode, on a pg.Pool whose
// connections reach the server through PgBouncer while another application
// shares its pool: the outbox Consumer, and the Express middleware in claim
// mode (duplicates sent at once wait for the holder, whose handler outlasts
// its lease and is kept by the heartbeat) and in transaction mode. Run from a copy of clients/node
// with its node_modules; argument: the connection string. Prints one line
// per check, "ok ..." or "not ok ...", and exits 1 on any failure.
import pg from 'pg';
import express from 'express';
import { Consumer } from './src/index.js';
import { idempotency } from './src/express.js';

const connectionString = process.argv[2];
const pool = new pg.Pool({ connectionString, max: 3 });
await pool.query(`SELECT count(idempotency.outbox_enqueue('node.events', jsonb_build_object('n', n)))
                    FROM generate_series(1, 30) n`);
const handled = [];
const errors = [];
let consumer;
const all = new Promise((resolve) => {
  consumer = new Consumer(pool, {
    topics: ['node.events'], name: 'node-consumer', pollInterval: 0.05,
    onError: (err) => errors.push(String(err)),
  }, async (event) => {
    handled.push(event.id);
    if (handled.length >= 30) resolve();
  });
});
const timeout = new Promise((resolve) => setTimeout(resolve, 60000));
await Promise.race([all, timeout]);

// While the consumer runs: two transactions at once take both server
// backends of the pool; neither may be listening for the consumer.
const probe = new pg.Pool({ connectionString, max: 2 });
async function backendState() {
  const client = await probe.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query(`SELECT pg_backend_pid() AS pid,
        (SELECT count(*) FROM pg_listening_channels())::int AS channels`);
    await client.query('SELECT pg_sleep(0.5)');
    await client.query('COMMIT');
    return rows[0];
  } finally {
    client.release();
  }
}
const channels = new Map();
for (let i = 0; i < 20 && channels.size < 2; i++) {
  for (const row of await Promise.all([backendState(), backendState()])) channels.set(row.pid, row.channels);
}
await consumer.stop();
await probe.end();

// Express: 20 keys, each sent three times at once, to each route.
const runs = new Map();
const counted = (req) => runs.set(req.path + req.idempotency.key, (runs.get(req.path + req.idempotency.key) ?? 0) + 1);
const app = express();
app.post('/slow', idempotency({ pool, scope: 'pooler.express', wait: 30, lease: 1 }), async (req, res) => {
  counted(req);
  await new Promise((resolve) => setTimeout(resolve, 2500));   // 2.5 leases: the heartbeat keeps it
  res.status(req.idempotency.signal.aborted ? 500 : 201).json({ ok: true });
});
app.post('/tx', idempotency({ pool, scope: 'pooler.express_tx', mode: 'transaction', wait: 30 }), async (req, res) => {
  counted(req);
  await req.idempotency.client.query('INSERT INTO express_effects VALUES ($1)', [req.idempotency.key]);
  res.status(201).json({ ok: true });
});
const server = app.listen(0, '127.0.0.1');
await new Promise((resolve) => server.once('listening', resolve));
const base = `http://127.0.0.1:${server.address().port}`;
const requests = [];
for (const path of ['/slow', '/tx']) {
  for (let copy = 0; copy < 3; copy++) {
    for (let i = 0; i < 20; i++) {
      requests.push(fetch(base + path, { method: 'POST', headers: { 'Idempotency-Key': `express-${i}` } })
        .then((res) => res.status, (err) => String(err)));
    }
  }
}
const statuses = new Map();
for (const status of await Promise.all(requests)) statuses.set(status, (statuses.get(status) ?? 0) + 1);
server.close();
const { rows: [effects] } = await pool.query('SELECT count(*)::int AS n, count(DISTINCT key)::int AS keys FROM express_effects');
await pool.end();

let failed = false;
function check(ok, what) {
  console.log(`${ok ? 'ok' : 'not ok'} ${what}`);
  failed ||= !ok;
}
check(handled.length === 30 && new Set(handled).size === 30,
  `node: the Consumer handled 30 events, each once (${new Set(handled).size} distinct)`);
check(errors.length === 0, `node: the Consumer reported no error ${errors.slice(0, 1)}`);
check(channels.size === 2 && [...channels.values()].every((n) => n === 0),
  `node: neither server backend of the pool listens for the Consumer (${JSON.stringify([...channels])})`);
check(statuses.size === 1 && statuses.get(201) === 120,
  `node: 120 Express requests, duplicates at once, answered 201 (${JSON.stringify([...statuses])})`);
check(runs.size === 40 && [...runs.values()].every((n) => n === 1),
  `node: each of 40 Express keys handled once (${[...runs.values()].reduce((a, b) => a + b, 0)} runs)`);
check(effects.n === 20 && effects.keys === 20,
  `node: the transaction mode's writes, each key's once (${effects.n} rows, ${effects.keys} keys)`);
process.exit(failed ? 1 : 0);
