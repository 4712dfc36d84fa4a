// POST /api/orders with an Idempotency-Key header: a Next.js App Router
// route handler wrapped by pg-idempotency/web. The order is written once
// per key; a repeat gets the stored response (Idempotent-Replayed: true),
// a concurrent duplicate waits up to 5 s for it (holding no connection of
// the pool), the key reused with another body gets 422, no key 400.
import { idempotencyOf, withIdempotency } from 'pg-idempotency/web';
import { pool } from '../../../lib/db.js';

export const runtime = 'nodejs';          // node-postgres needs Node.js, not the edge runtime
export const dynamic = 'force-dynamic';

export const POST = withIdempotency({ pool, scope: 'next.orders', wait: 5 }, async (request) => {
  const body = await request.json().catch(() => null);
  if (!body || typeof body.item !== 'string') {
    return Response.json({ title: 'Invalid order', status: 400 }, { status: 400 });   // final: replayed too
  }
  const { key } = idempotencyOf(request);
  await new Promise((resolve) => setTimeout(resolve, Number(process.env.HANDLER_MS ?? 300)));   // the slow part
  const { rows: [order] } = await pool.query(
    'INSERT INTO orders (idempotency_key, item) VALUES ($1, $2) RETURNING id', [key, body.item]);
  return Response.json({ order: Number(order.id), item: body.item }, {
    status: 201, headers: { location: `/api/orders/${order.id}` },
  });
});
