import assert from 'node:assert/strict';
import { once } from 'node:events';
import { test } from 'node:test';
import express from 'express';
import { idempotency } from '../src/express.js';
import { newKey, newPool } from './helpers.js';
import { httpSuite } from './http-suite.js';

async function listen(app) {
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => { server.close(resolve); server.closeAllConnections(); }),
  };
}

httpSuite('express', (pool, routes) => {
  const app = express();
  app.use(express.json());
  for (const { path, options, handler } of routes) {
    app.post(path, idempotency({ pool, ...options }), async (req, res) => {
      const { status, headers = {}, json, body } = await handler({ body: req.body, idempotency: req.idempotency });
      res.status(status).set(headers);
      if (json !== undefined) res.json(json);
      else res.send(body);
    });
  }
  app.use((err, req, res, next) => res.status(500).json({ error: err.message }));   // eslint-disable-line no-unused-vars
  return listen(app);
});

test('express: a response written in pieces with writeHead is held, stored and replayed whole', async () => {
  const pool = newPool();
  const app = express();
  app.use(express.json());
  let runs = 0;
  app.post('/stream', idempotency({ pool, scope: 'express.stream' }), (req, res) => {
    runs += 1;
    res.writeHead(200, { 'content-type': 'text/plain', 'x-run': String(runs) });
    res.write('one ');
    setTimeout(() => res.end('two'), 20);
  });
  const server = await listen(app);
  const key = newKey();
  const send = () => fetch(`${server.url}/stream`, { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' });
  const first = await send();
  assert.equal(await first.text(), 'one two');
  const again = await send();
  assert.equal(await again.text(), 'one two');
  assert.equal(again.headers.get('x-run'), '1');
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(runs, 1);
  await server.close();
  await pool.end();
});
