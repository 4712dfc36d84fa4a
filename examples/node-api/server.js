// Serves route.js with plain node:http on loopback, the way Next.js would
// serve app/api/payments/route.js. Prints the address it listens on (and
// writes the port to $PORT_FILE when set); PORT=0 picks a free port.
import http from 'node:http';
import { writeFileSync } from 'node:fs';
import { pool } from './db.js';
import { POST } from './route.js';

const MAX_BODY = 64 * 1024;
const routes = { '/api/payments': { POST } };

const server = http.createServer(async (req, res) => {
  let response;
  try {
    response = await dispatch(req);
  } catch (err) {
    console.error(`${req.method} ${req.url}:`, err);
    response = Response.json({ title: 'Internal error', status: 500 }, { status: 500 });
  }
  res.writeHead(response.status, Object.fromEntries(response.headers));
  res.end(Buffer.from(await response.arrayBuffer()));
});

async function dispatch(req) {
  const url = new URL(req.url, 'http://localhost');
  const route = routes[url.pathname];
  if (!route) return Response.json({ title: 'Not found', status: 404 }, { status: 404 });
  const handler = route[req.method];
  if (!handler) return new Response(null, { status: 405, headers: { Allow: Object.keys(route).join(', ') } });

  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) return Response.json({ title: 'Body too large', status: 413 }, { status: 413 });
    chunks.push(chunk);
  }
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  const body = req.method === 'GET' || req.method === 'HEAD' ? undefined : Buffer.concat(chunks);
  return handler(new Request(url, { method: req.method, headers, body }));
}

server.listen(Number(process.env.PORT ?? 3000), '127.0.0.1', () => {
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
