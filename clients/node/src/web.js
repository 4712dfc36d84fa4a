// The Idempotency-Key header for web-standard handlers: a function of a
// Request that resolves to a Response, as Next.js App Router route
// handlers, Hono (c.req.raw), Bun.serve and Deno.serve use (see http.js
// for what is answered and recorded):
//
//   export const POST = withIdempotency({ pool }, async (request) => Response.json(...));
//
// The handler gets the same arguments (the request, and whatever the
// framework passes after it); idempotencyOf(request) is its context. The
// fingerprint covers the body: JSON (by its content type) in canonical
// form, anything else byte for byte. The handler's response is read whole,
// recorded, then returned. request.signal aborting (the client went away)
// ends a wait and stops the heartbeat of a running handler.
import { begin, httpOptions } from './http.js';
import { problem } from './response.js';

const contexts = new WeakMap();

export function idempotencyOf(request) {
  return contexts.get(request) ?? null;
}

async function fingerprintBody(request) {
  if (request.body === null) return undefined;
  const bytes = Buffer.from(await request.clone().arrayBuffer());
  if (bytes.length === 0) return undefined;
  if (/^application\/([\w.+-]*\+)?json\b/i.test(request.headers.get('content-type') ?? '')) {
    try {
      return JSON.parse(bytes.toString('utf8'));
    } catch {
      return bytes;   // not JSON after all: its bytes
    }
  }
  return bytes;
}

const toResponse = ({ status, headers, body }) => {
  const out = new Headers();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const one of [].concat(value)) out.append(name, String(one));
  }
  const empty = status === 204 || status === 205 || status === 304;
  return new Response(empty ? null : body, { status, headers: out });
};

const fromResponse = async (res) => {
  const headers = {};
  for (const [name, value] of res.headers) {
    if (name === 'set-cookie') continue;
    headers[name] = value;
  }
  const cookies = res.headers.getSetCookie?.() ?? [];
  if (cookies.length) headers['set-cookie'] = cookies;
  return { status: res.status, headers, body: Buffer.from(await res.arrayBuffer()) };
};

export function withIdempotency(options, handler) {
  const opts = httpOptions(options);
  return async function idempotentHandler(request, ...rest) {
    const url = new URL(request.url);
    const started = await begin(opts, {
      method: request.method.toUpperCase(),
      key: request.headers.get(opts.header),
      path: url.pathname,
      body: opts.methods.includes(request.method.toUpperCase()) ? await fingerprintBody(request) : undefined,
      signal: request.signal ?? null,
    });
    if (started.response) return toResponse(started.response);
    if (!started.exchange) return handler(request, ...rest);
    const { exchange } = started;
    const onGone = () => exchange.disconnect();
    if (request.signal?.aborted) onGone();
    else request.signal?.addEventListener('abort', onGone, { once: true });
    contexts.set(request, exchange.context);
    let answer;
    try {
      answer = await fromResponse(await handler(request, ...rest));
    } catch (err) {
      await exchange.abort(err);
      throw err;
    } finally {
      request.signal?.removeEventListener('abort', onGone);
    }
    try {
      return toResponse(await exchange.finish(answer));
    } catch (err) {
      return toResponse(problem(500, 'Internal error', String(err.message)));
    }
  };
}

export default withIdempotency;
