// The Node client through a pooler in transaction mode, on a pg.Pool whose
// connections reach the server through PgBouncer while another application
// shares its pool: the outbox Consumer; the Express middleware, the Fastify
// plugin and the web-standard wrapper, each in claim mode (duplicates sent
// at once wait for the holder, whose handler outlasts its lease and is kept
// by the heartbeat) and in transaction mode; and claim() with duplicates
// that wait for its holder. Run from a copy of clients/node with its
// node_modules; argument: the connection string. Prints one line per
// check, "ok ..." or "not ok ...", and exits 1 on any failure.
import pg from 'pg';
import express from 'express';
import Fastify from 'fastify';
import { claim, Consumer } from './src/index.js';
import { idempotency } from './src/express.js';
import { idempotency as fastifyIdempotency } from './src/fastify.js';
import { idempotencyOf, withIdempotency } from './src/web.js';

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
// The slow routes' lease, 3 s, outlasted by their 5 s of work: the heartbeat
// keeps it. Its beats (every second) go on a connection of their own, beside
// the pool of 3 and its 120 requests at once: sharing the pool, they waited
// for a connection past the lease on a busy machine (the key was taken
// over, its work ran twice, and fenced).
const SLOW_LEASE = 3;
app.post('/slow', idempotency({ pool, scope: 'pooler.express', wait: 30, lease: SLOW_LEASE }), async (req, res) => {
  counted(req);
  await new Promise((resolve) => setTimeout(resolve, 5000));   // 1.7 leases: the heartbeat keeps it
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

// Fastify and the web wrapper, the same way: 10 keys, each sent three times
// at once, to each route. A handler counts its runs by route and key.
const fastifyRuns = new Map();
const webRuns = new Map();
const count = (runsOf, what) => runsOf.set(what, (runsOf.get(what) ?? 0) + 1);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const fastify = Fastify();
fastify.register(async (scope) => {
  await scope.register(fastifyIdempotency, { pool, scope: 'pooler.fastify', wait: 30, lease: SLOW_LEASE });
  scope.post('/slow', async (request, reply) => {
    count(fastifyRuns, '/slow' + request.idempotency.key);
    await sleep(5000);
    return reply.code(201).send({ ok: true });
  });
});
fastify.register(async (scope) => {
  await scope.register(fastifyIdempotency, { pool, scope: 'pooler.fastify_tx', mode: 'transaction', wait: 30 });
  scope.post('/tx', async (request, reply) => {
    count(fastifyRuns, '/tx' + request.idempotency.key);
    await request.idempotency.client.query('INSERT INTO fastify_effects VALUES ($1)', [request.idempotency.key]);
    return reply.code(201).send({ ok: true });
  });
});
const webSlow = withIdempotency({ pool, scope: 'pooler.web', wait: 30, lease: SLOW_LEASE }, async (request) => {
  count(webRuns, '/slow' + idempotencyOf(request).key);
  await sleep(5000);
  return Response.json({ ok: true }, { status: 201 });
});
const webTx = withIdempotency({ pool, scope: 'pooler.web_tx', mode: 'transaction', wait: 30 }, async (request) => {
  const context = idempotencyOf(request);
  count(webRuns, '/tx' + context.key);
  await context.client.query('INSERT INTO web_effects VALUES ($1)', [context.key]);
  return Response.json({ ok: true }, { status: 201 });
});
const frameworkRequests = [];
for (let copy = 0; copy < 3; copy++) {
  for (let i = 0; i < 10; i++) {
    const headers = { 'idempotency-key': `framework-${i}` };
    for (const url of ['/slow', '/tx']) {
      frameworkRequests.push(fastify.inject({ method: 'POST', url, headers })
        .then((res) => `fastify ${res.statusCode}`, (err) => String(err)));
    }
    for (const handler of [webSlow, webTx]) {
      frameworkRequests.push(handler(new Request('http://app.test/', { method: 'POST', headers }))
        .then((res) => `web ${res.status}`, (err) => String(err)));
    }
  }
}
const frameworkStatuses = new Map();
for (const status of await Promise.all(frameworkRequests)) {
  frameworkStatuses.set(status, (frameworkStatuses.get(status) ?? 0) + 1);
}
await fastify.close();

// claim() with duplicates that wait: the holder works 1 s; three
// duplicates started meanwhile wait (off the pool) and take its result.
let claimRuns = 0;
const work = async () => {
  claimRuns += 1;
  await sleep(1000);
  return { n: 1 };
};
const holder = claim(pool, { key: 'node-claim-wait', scope: 'pooler.claim', lease: 60 }, work);
await sleep(200);
const waiters = await Promise.all([1, 2, 3].map(() =>
  claim(pool, { key: 'node-claim-wait', scope: 'pooler.claim', wait: 20 }, work)));
const claimOutcomes = [(await holder).outcome, ...waiters.map((answer) => answer.outcome)];

const effectsOf = async (table) => (await pool.query(
  `SELECT count(*)::int AS n, count(DISTINCT key)::int AS keys FROM ${table}`)).rows[0];
const effects = await effectsOf('express_effects');
const fastifyEffects = await effectsOf('fastify_effects');
const webEffects = await effectsOf('web_effects');
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
check(frameworkStatuses.size === 2 && frameworkStatuses.get('fastify 201') === 60 && frameworkStatuses.get('web 201') === 60,
  `node: 60 Fastify and 60 web requests, duplicates at once, answered 201 (${JSON.stringify([...frameworkStatuses])})`);
const once = (runsOf) => runsOf.size === 20 && [...runsOf.values()].every((n) => n === 1);
check(once(fastifyRuns) && once(webRuns),
  `node: each of 20 Fastify and 20 web keys handled once (${fastifyRuns.size} and ${webRuns.size} keys, `
  + `${[...fastifyRuns.values(), ...webRuns.values()].reduce((a, b) => a + b, 0)} runs)`);
check([fastifyEffects, webEffects].every((e) => e.n === 10 && e.keys === 10),
  `node: the Fastify and web transaction modes' writes, each key's once (${JSON.stringify([fastifyEffects, webEffects])})`);
check(claimRuns === 1 && claimOutcomes.every((outcome) => outcome === 'completed'),
  `node: claim() with 3 waiting duplicates: the work ran once, all completed (${claimRuns} runs, ${claimOutcomes})`);
process.exit(failed ? 1 : 0);
