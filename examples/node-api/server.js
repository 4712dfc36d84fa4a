// POST /api/payments with an Idempotency-Key header, on Express and the
// client's middleware in register mode: in one transaction the key is
// registered and the payment job enqueued (a job exists if and only if its
// key does); the answer is 202. Repeats get 409 until worker.js has done
// the job, then its result (200), or 402 when the payment was refused;
// another body under the key gets 422, no key 400.
// Prints the address it listens on (and writes the port to $PORT_FILE when
// set); PORT=0 picks a free port.
import { writeFileSync } from 'node:fs';
import express from 'express';
import { enqueue, jsonResponse, problem } from 'pg-idempotency';
import { idempotency } from 'pg-idempotency/express';
import { SCOPE, TOPIC, newPool } from './payments.js';

const pool = newPool('payments api');
const app = express();

app.post('/api/payments', express.json({ limit: '64kb' }), idempotency({
  pool, scope: SCOPE, mode: 'register',
  failedResponse: (error) => jsonResponse(error.startsWith('insufficient_funds') ? 402 : 500, { status: 'failed', error }),
}), async (req, res) => {
  const invalid = validatePayment(req.body);
  if (invalid) return send(res, problem(400, 'Invalid payment', invalid));   // nothing registered
  const { key, request, client } = req.idempotency;
  await enqueue(client, TOPIC, { key, request, payment: req.body }, { dedupKey: key });
  res.status(202).json({ status: 'accepted', idempotency_key: key });
});

// A body that is not JSON, and anything unexpected: RFC 9457 problems.
app.use((err, req, res, next) => {   // eslint-disable-line no-unused-vars
  const status = err.status ?? 500;
  if (status >= 500) console.error(`${req.method} ${req.url}:`, err);
  send(res, problem(status, status === 400 ? 'Invalid body' : 'Internal error', err.expose ? err.message : ''));
});

function validatePayment(body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'The body must be a JSON object.';
  if (typeof body.account !== 'string' || !body.account || body.account.length > 64) return '"account" must be a non-empty string.';
  if (!Number.isSafeInteger(body.amount) || body.amount <= 0) return '"amount" must be a positive integer (cents).';
  return null;
}

const send = (res, { status, headers, body }) => res.status(status).set(headers).send(body);

const server = app.listen(Number(process.env.PORT ?? 3000), '127.0.0.1', () => {
  const { port } = server.address();
  console.log(`payments API listening on http://127.0.0.1:${port}/api/payments`);
  if (process.env.PORT_FILE) writeFileSync(process.env.PORT_FILE, `${port}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close(() => pool.end().then(() => process.exit(0)));
    server.closeIdleConnections();
  });
}
