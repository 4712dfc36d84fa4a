// Fastify plugin for the Idempotency-Key header (see http.js). Its hooks
// cover the routes of the scope it is registered in:
//   await app.register(idempotency, { pool });
//   app.post('/orders', handler);
// The fingerprint covers the parsed body; the handler's response is
// recorded in onSend, before it is sent.
import { begin, httpOptions } from './http.js';

const EXCHANGE = Symbol('idempotency exchange');

export async function idempotency(fastify, options) {
  const opts = httpOptions(options);
  if (!fastify.hasRequestDecorator('idempotency')) fastify.decorateRequest('idempotency', null);

  fastify.addHook('preHandler', async (request, reply) => {
    // The client going away ends a wait and stops a running handler's heartbeat.
    const gone = new AbortController();
    reply.raw.once('close', () => {
      if (reply.raw.writableFinished) return;
      gone.abort(new Error('the client closed the connection'));
      request[EXCHANGE]?.disconnect();
    });
    const started = await begin(opts, {
      method: request.method,
      key: request.headers[opts.header.toLowerCase()],
      path: request.url.split('?')[0],
      body: request.body,
      signal: gone.signal,
    });
    if (started.response) {
      const { status, headers, body } = started.response;
      return reply.code(status).headers(headers).send(body);
    }
    if (started.exchange) {
      request[EXCHANGE] = started.exchange;
      request.idempotency = started.exchange.context;
    }
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const exchange = request[EXCHANGE];
    if (!exchange || exchange.settled) return payload;
    const body = await toBuffer(payload);
    const sent = await exchange.finish({ status: reply.statusCode, headers: reply.getHeaders(), body });
    if (sent.body !== body) {
      reply.code(sent.status);
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      reply.headers(sent.headers);
    }
    return sent.body;
  });

  // A reply that never went through onSend (hijacked, or its socket gone).
  fastify.addHook('onResponse', async (request) => {
    await request[EXCHANGE]?.abort(new Error('no response recorded'));
  });
}
// Hooks apply to the scope that registers the plugin, not to a scope of its own.
idempotency[Symbol.for('skip-override')] = true;
idempotency[Symbol.for('fastify.display-name')] = 'pg-idempotency';

export default idempotency;

async function toBuffer(payload) {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload);
  const chunks = [];
  for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
  return Buffer.concat(chunks);
}
