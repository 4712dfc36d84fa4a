// Starts test/fixtures/server.js as a child process and follows what it
// prints (one JSON value a line): ready() resolves to its URL, seen(fn)
// resolves once a line satisfies fn, exited resolves to { code, at }.
import { spawn } from 'node:child_process';
import http from 'node:http';
import { createInterface } from 'node:readline';

export function startServer(env) {
  const child = spawn(process.execPath, [new URL('./fixtures/server.js', import.meta.url).pathname], {
    env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = [];
  const watchers = new Set();
  createInterface({ input: child.stdout }).on('line', (text) => {
    let value;
    try { value = JSON.parse(text); } catch { return; }
    lines.push(value);
    for (const watcher of [...watchers]) if (watcher.fn(value)) { watchers.delete(watcher); watcher.resolve(value); }
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal, at: performance.now() })));
  const seen = (fn, what = 'a line', seconds = 30) => {
    const found = lines.find(fn);
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const watcher = { fn, resolve };
      watchers.add(watcher);
      exited.then(() => { if (watchers.delete(watcher)) reject(new Error(`the server exited before ${what}`)); });
      setTimeout(() => { if (watchers.delete(watcher)) reject(new Error(`timed out waiting for ${what}`)); }, seconds * 1000).unref();
    });
  };
  const url = seen((v) => v.port, 'its port').then(({ port }) => `http://127.0.0.1:${port}`);
  url.catch(() => {});   // reported to whoever awaits it
  return {
    child, lines, seen, exited, url,
    kill: () => { if (child.exitCode === null) child.kill('SIGKILL'); },
  };
}

// Keep-alive connections, opened before a burst (warm(url, n)), so that a
// burst measures the requests, not TCP handshakes.
const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });

function request(url, method, path, headers, body) {
  const { hostname, port } = new URL(url);
  const start = performance.now();
  return new Promise((resolve) => {
    const req = http.request({ host: hostname, port, method, path, agent, headers }, (res) => {
      const chunks = [];
      res.on('data', (chunk) => chunks.push(chunk));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        resolve({
          status: res.statusCode, replayed: res.headers['idempotent-replayed'] === 'true',
          retryAfter: res.headers['retry-after'] ?? null, text, ms: performance.now() - start,
        });
      });
      res.on('error', (error) => resolve({ error, ms: performance.now() - start }));
    });
    req.on('error', (error) => resolve({ error, ms: performance.now() - start }));
    req.end(body);
  });
}

export const warm = (url, n) => Promise.all(Array.from({ length: n }, () => request(url, 'GET', '/runs', {})));

export async function runs(url) {
  return JSON.parse((await request(url, 'GET', '/runs', {})).text);
}

// POSTs body with the key; resolves to { status, replayed, retryAfter,
// text, ms } (ms from the send to the whole answer), or { error, ms }.
export function post(url, key, body = {}) {
  return request(url, 'POST', '/orders', { 'content-type': 'application/json', 'idempotency-key': key }, JSON.stringify(body));
}

export function figures(values) {
  if (values.length === 0) return 'none';
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return `n=${sorted.length} p50=${Math.round(at(0.5))} ms max=${Math.round(sorted.at(-1))} ms`;
}
