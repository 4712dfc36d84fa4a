// A Node service for the Go client's shared-key test: POST /orders under
// the Node client's Express middleware (scope go.shared), answering 201
// with a body that says it came from Node. Prints {"port":N} once
// listening. CLIENT_SRC is the URL of the Node client's src folder;
// express and pg resolve from NODE_MODULES (a folder URL ending in /).
const modules = process.env.NODE_MODULES;
const { default: express } = await import(new URL('express/index.js', modules));
const { default: pg } = await import(new URL('pg/lib/index.js', modules));
const { idempotency } = await import(new URL('express.js', process.env.CLIENT_SRC));

const pool = new pg.Pool({ max: 4 });
const app = express();
let runs = 0;
app.post('/orders', express.json(), idempotency({ pool, scope: 'go.shared' }), (req, res) => {
  runs += 1;
  res.status(201).set('Location', `/orders/node-${runs}`).json({ by: 'node', run: runs, item: req.body.item });
});
const server = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
process.once('SIGTERM', () => { server.close(); pool.end(); });
