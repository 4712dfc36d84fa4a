// Compiled (not run) by types.test.js: the declarations describe the API
// as the documentation uses it, and reject what it does not allow.
import express from 'express';
import Fastify from 'fastify';
import pg from 'pg';
import { FinalError, claim, consume, enqueue, jsonResponse, settlement, shutdown, startMaintenance, type ClaimResult, type Settlement } from 'pg-idempotency';
import { idempotencyOf, withIdempotency } from 'pg-idempotency/web';
import { idempotency } from 'pg-idempotency/express';
import fastifyIdempotency from 'pg-idempotency/fastify';

declare const pool: pg.Pool;

async function worker(): Promise<void> {
  const outcome: ClaimResult<{ id: string }> = await claim(pool, { key: 'k', request: { a: 1 }, lease: 10 }, async (job) => {
    if (job.attempt > 3) throw new FinalError('too many');
    return job.transaction(async (client) => {
      await client.query('SELECT 1');
      return { id: job.token };
    });
  });
  if (outcome.outcome === 'completed') outcome.result.id.toUpperCase();
  if (outcome.outcome === 'in_progress') outcome.retryAfter.toFixed();
  // @ts-expect-error: a failed outcome has no result
  if (outcome.outcome === 'failed') console.log(outcome.result);

  const id: string = await enqueue(pool, 'topic', { a: [1, 2] }, { dedupKey: 'd', key: 'k' });
  const consumer = consume(pool, { topics: ['topic'], concurrency: 2 }, async (event) => event.payload);
  await consumer.stop();
  console.log(id);
}

const app = express();
app.post('/orders', express.json(), idempotency({ pool, scope: 'orders', wait: 5 }), (req, res) => {
  res.status(201).json({ key: req.idempotency?.key });
});
app.post('/jobs', idempotency({ pool, mode: 'register', failedResponse: (error) => jsonResponse(402, { error }) }),
  async (req, res) => {
    await enqueue(req.idempotency!.client!, 'jobs', { request: req.idempotency!.request });
    res.status(202).end();
  });
// @ts-expect-error: an unknown mode
idempotency({ pool, mode: 'sometimes' });

const fastify = Fastify();
fastify.register(async (scope) => {
  await scope.register(fastifyIdempotency, { pool, classify: (r) => (r.status >= 500 ? 'retryable' : 'complete') });
  scope.post('/orders', async (request) => ({ key: request.idempotency?.key }));
});

// A Next.js App Router route handler.
export const POST = withIdempotency({ pool, scope: 'orders', wait: 5, onConflict: (e) => console.log(e.retryAfter) },
  async (request: Request, context: { params: Promise<{ id: string }> }) => {
    const { id } = await context.params;
    const key: string | undefined = idempotencyOf(request)?.key;
    return Response.json({ id, key }, { status: 201 });
  });
void shutdown(pool, { timeout: 5 });
// @ts-expect-error: a handler must return a Response
withIdempotency({ pool }, async () => 'text');

void worker;

// The SQL edition's sweeps on an interval.
const sweeps = startMaintenance(pool, { intervalMs: 5000, onPass: (tasks) => tasks.map((t) => t.task + t.rows) });
void sweeps.stop();
// @ts-expect-error: the interval is a number of milliseconds
startMaintenance(pool, { intervalMs: '5s' });

// A consumer's settlement, as consume() makes it: a key held elsewhere is
// released after its retryAfter; classify's own error goes to onError.
const settled: Settlement = settlement({ outcome: 'in_progress', retryAfter: 2 }, null, undefined, (err) => console.error(err));
if (settled[0] === 'release') {
  const after: number | null | undefined = settled[1];
  void after;
}
