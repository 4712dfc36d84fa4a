// A Node service for the Go client's shared-key tests: the Node client's
// Express middleware in its three modes, on the scopes the Go side uses.
//   POST /orders  claim mode (go.shared): 201 with a body that says Node
//   POST /tx      transaction mode (go.shared.tx): writes a row of
//                 go_shared_effects on the request's client, then 201
//   POST /jobs    register mode (go.shared.jobs): enqueues the key's job
//                 (topic go.shared.jobs, payload { key, request }), 202
// Prints {"port":N} once listening. CLIENT_SRC is the URL of the Node
// client's src folder; express and pg resolve from NODE_MODULES (a folder
// URL ending in /).
const modules = process.env.NODE_MODULES;
const { default: express } = await import(new URL('express/index.js', modules));
const { default: pg } = await import(new URL('pg/lib/index.js', modules));
const { idempotency } = await import(new URL('express.js', process.env.CLIENT_SRC));
const { enqueue } = await import(new URL('index.js', process.env.CLIENT_SRC));

const pool = new pg.Pool({ max: 4 });
const app = express();
let runs = 0;
app.post('/orders', express.json(), idempotency({ pool, scope: 'go.shared' }), (req, res) => {
  runs += 1;
  res.status(201).set('Location', `/orders/node-${runs}`).json({ by: 'node', run: runs, item: req.body.item });
});
app.post('/tx', express.json(), idempotency({ pool, scope: 'go.shared.tx', mode: 'transaction' }), async (req, res) => {
  runs += 1;
  await req.idempotency.client.query("INSERT INTO go_shared_effects VALUES ($1, 'node')", [req.idempotency.key]);
  res.status(201).set('Location', `/tx/node-${runs}`).json({ by: 'node', run: runs });
});
app.post('/jobs', express.json(), idempotency({ pool, scope: 'go.shared.jobs', mode: 'register' }), async (req, res) => {
  runs += 1;
  const { key, request } = req.idempotency;
  await enqueue(req.idempotency.client, 'go.shared.jobs', { key, request }, { dedupKey: key });
  res.status(202).json({ by: 'node', accepted: key });
});
const server = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
process.once('SIGTERM', () => { server.close(); pool.end(); });
