// Express middleware for the Idempotency-Key header (see http.js):
//   app.post('/orders', express.json(), idempotency({ pool }), handler)
// Mount it after the body parser: the fingerprint covers req.body. The
// handler's response is held until it is recorded, then sent.
import { begin, httpOptions } from './http.js';
import { problem } from './response.js';

export function idempotency(options) {
  const opts = httpOptions(options);
  return async function idempotencyMiddleware(req, res, next) {
    // The client going away ends a wait, and stops the heartbeat of a
    // running handler (whose signal is aborted).
    const gone = new AbortController();
    let exchange = null;
    res.once('close', () => {
      if (res.writableFinished) return;
      gone.abort(new Error('the client closed the connection'));
      exchange?.disconnect();
    });
    let started;
    try {
      started = await begin(opts, {
        method: req.method,
        key: req.get(opts.header),
        path: req.originalUrl.split('?')[0],
        body: req.body,
        signal: gone.signal,
      });
    } catch (err) {
      return next(err);
    }
    if (started.response) return send(res, started.response);
    if (!started.exchange) return next();
    exchange = started.exchange;
    if (gone.signal.aborted) exchange.disconnect();
    req.idempotency = exchange.context;
    hold(res, async (response) => send(res, await exchange.finish(response)));
    next();
  };
}

// Buffers what the handler writes; once it ends the response, calls
// release(response) with the originals of writeHead, write and end back.
function hold(res, release) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const chunks = [];
  const append = (chunk, encoding) => {
    if (chunk !== undefined && chunk !== null) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, encoding));
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') headers = reason;
    else res.statusMessage = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i < headers.length; i += 2) res.appendHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function write(chunk, encoding, callback) {
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    append(chunk, encoding);
    if (callback) process.nextTick(callback);
    return true;
  };
  res.end = function end(chunk, encoding, callback) {
    if (typeof chunk === 'function') [callback, chunk] = [chunk, undefined];
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    append(chunk, encoding);
    Object.assign(res, original);
    if (callback) res.once('finish', callback);
    release({ status: res.statusCode, headers: res.getHeaders(), body: Buffer.concat(chunks) })
      .catch((err) => send(res, problem(500, 'Internal error', String(err.message))));
    return res;
  };
}

function send(res, { status, headers, body }) {
  if (res.headersSent) return res.end();
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  res.setHeader('content-length', body.length);
  res.statusCode = status;
  return res.end(body);
}
