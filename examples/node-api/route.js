// POST /api/payments, written as a Next.js App Router route handler
// (app/api/payments/route.js): it takes a Web Request and returns a Web
// Response. server.js serves it with plain node:http.
//
// Idempotency follows the IETF draft "The Idempotency-Key HTTP Header
// Field": the client sends a unique Idempotency-Key with a payment and the
// same key with every retry of it. In ONE transaction the key is registered
// (with the fingerprint of the body) and the payment job is enqueued in the
// outbox, so a job exists if and only if its key does, and no retry can
// enqueue a second one. The answer depends on the key's state:
//
//   new key                          202 Accepted: the job is queued
//   queued, or being processed       409 Conflict, with Retry-After
//   done                             the stored response, replayed: 200 and the result
//   done, and the payment refused    the stored response, replayed: 402 and the reason
//   same key, another body           422 Unprocessable Content
//   no Idempotency-Key header        400 Bad Request
import { transaction } from './db.js';

export const SCOPE = 'payments';          // the kind of operation the keys name
export const TOPIC = 'payments.charge';   // the outbox topic the worker consumes

export async function POST(request) {
  const key = request.headers.get('idempotency-key');
  if (!key) return problem(400, 'Idempotency-Key is missing', 'This endpoint requires an Idempotency-Key header.');
  if (Buffer.byteLength(key) > 255) return problem(400, 'Idempotency-Key is too long', 'At most 255 bytes.');

  let body;
  try {
    body = await request.json();
  } catch {
    return problem(400, 'Invalid body', 'The body must be JSON.');
  }
  const invalid = validatePayment(body);
  if (invalid) return problem(400, 'Invalid payment', invalid);

  const answer = await transaction(async (client) => {
    const { rows: [registered] } = await client.query(
      `SELECT outcome, result, error, ceil(extract(epoch FROM retry_after))::int AS retry_after
         FROM idempotency.idem_register($1, $2, job_ref => $1, scope => $3)`,
      [key, body, SCOPE]);
    if (registered.outcome === 'registered') {
      // dedup_key: even a second register of the key could not enqueue twice.
      await client.query('SELECT idempotency.outbox_enqueue($1, $2, dedup_key => $3)',
        [TOPIC, { key, request: body }, key]);
    }
    return registered;
  });

  switch (answer.outcome) {
    case 'registered':
      return Response.json({ status: 'accepted', idempotency_key: key }, { status: 202 });
    case 'in_progress':
    case 'retry_later':
      return problem(409, 'Request in progress',
        'A request with this Idempotency-Key is being processed; retry later.',
        { 'Retry-After': String(Math.max(1, answer.retry_after ?? 1)) });
    case 'completed':
      return replay(200, answer.result);
    case 'failed':
      return replay(answer.error?.startsWith('insufficient_funds') ? 402 : 500,
        { status: 'failed', error: answer.error });
    case 'mismatch':
      return problem(422, 'Idempotency-Key reused',
        'This Idempotency-Key was already used with a different request body.');
    default:
      throw new Error(`unexpected outcome ${answer.outcome}`);
  }
}

function validatePayment(body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'The body must be a JSON object.';
  if (typeof body.account !== 'string' || body.account.length === 0 || body.account.length > 64) {
    return '"account" must be a non-empty string.';
  }
  if (!Number.isSafeInteger(body.amount) || body.amount <= 0) return '"amount" must be a positive integer (cents).';
  return null;
}

// The stored response of the first request, sent again.
function replay(status, body) {
  return Response.json(body, { status, headers: { 'Idempotent-Replayed': 'true' } });
}

// RFC 9457 problem details.
function problem(status, title, detail, headers = {}) {
  return new Response(JSON.stringify({ title, status, detail }), {
    status,
    headers: { 'Content-Type': 'application/problem+json', ...headers },
  });
}
