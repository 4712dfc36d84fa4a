// The Idempotency-Key behaviour both middlewares share, run against a real
// server of each framework (express.test.js, fastify.test.js). A server
// factory takes the pool and a list of routes { path, options, handler }
// where handler({ body, idempotency }) resolves to { status, headers, json }
// or { status, headers, body } (a Buffer), or throws.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { claim, enqueue } from '../src/index.js';
import { expireResult, newKey, newPool, sleep } from './helpers.js';

export function httpSuite(framework, startServer) {
  describe(`${framework} middleware`, () => {
    const pool = newPool();
    const runs = new Map();          // per key: how many times a handler ran
    const ran = (key) => runs.get(key) ?? 0;
    const count = (key) => runs.set(key, ran(key) + 1).get(key);
    const charges = new Map();       // per step key: how many charges the provider saw
    const errors = [];               // what onError heard
    const onError = (event) => errors.push(event);
    const brokenClassify = () => { throw new Error('classify is broken'); };
    // A pool whose idem_complete is refused (as a revoked grant would be).
    const refusing = {
      query: (text, params) => (/idem_complete/.test(text)
        ? Promise.reject(Object.assign(new Error('permission denied for function idem_complete'),
          { code: '42501', severity: 'ERROR' }))
        : pool.query(text, params)),
      connect: () => pool.connect(),
      get ending() { return pool.ending; },
    };
    let server;

    const routes = [
      {
        path: '/orders', options: { scope: `${framework}.orders` },
        handler: async ({ body, idempotency }) => {
          const n = count(idempotency.key);
          if (body?.delay) await sleep(body.delay);
          return { status: 201, headers: { 'x-order': `order-${n}` }, json: { order: n, echo: body } };
        },
      },
      {
        path: '/waiting', options: { scope: `${framework}.orders`, wait: 10 },
        handler: async ({ body, idempotency }) => {
          const n = count(idempotency.key);
          await sleep(body.delay);
          return { status: 201, json: { order: n } };
        },
      },
      {
        // Multi-step: a write in this database, then a charge at a provider
        // (charges, by the step's key); the first run answers 503 after the
        // charge, and the retry resumes after both steps.
        path: '/steps', options: { scope: `${framework}.steps` },
        handler: async ({ idempotency }) => {
          const n = count(idempotency.key);
          const resumed = [...idempotency.steps.keys()];
          const reserve = await idempotency.step('reserve', async (client) => {
            await client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [idempotency.key, 'reserve']);
            return { reserved: 1 };
          });
          const charge = await idempotency.step('charge', async (client, step) => {
            charges.set(step.key, (charges.get(step.key) ?? 0) + 1);
            return { charge: step.key };
          });
          if (n === 1) return { status: 503, json: { error: 'mail provider down' } };
          return { status: 201, json: { reserve, charge, resumed, stepKey: idempotency.stepKey('charge') } };
        },
      },
      {
        path: '/flaky', options: { scope: `${framework}.flaky` },
        handler: async ({ idempotency }) => (count(idempotency.key) === 1
          ? { status: 503, json: { error: 'try again' } }
          : { status: 201, json: { ok: true } }),
      },
      {
        path: '/throws', options: { scope: `${framework}.throws` },
        handler: async ({ idempotency }) => {
          if (count(idempotency.key) === 1) throw new Error('boom');
          return { status: 200, json: { ok: true } };
        },
      },
      {
        path: '/declined', options: { scope: `${framework}.declined` },
        handler: async ({ idempotency }) => ({ status: 402, json: { declined: count(idempotency.key) } }),
      },
      {
        path: '/classified', options: { scope: `${framework}.classified`, classify: () => 'final' },
        handler: async ({ idempotency }) => ({ status: 503, json: { run: count(idempotency.key) } }),
      },
      {
        path: '/binary', options: { scope: `${framework}.binary` },
        handler: async ({ idempotency }) => {
          count(idempotency.key);
          return { status: 200, headers: { 'content-type': 'application/octet-stream' }, body: Buffer.from([0, 255, 128, 10, 13]) };
        },
      },
      {
        path: '/tx', options: { scope: `${framework}.tx`, mode: 'transaction' },
        handler: async ({ body, idempotency }) => {
          count(idempotency.key);
          await idempotency.client.query('INSERT INTO effects (key, worker) VALUES ($1, $2)', [idempotency.key, framework]);
          if (body?.delay) await sleep(body.delay);
          if (body?.fail) return { status: 500, json: { error: 'failed after writing' } };
          if (body?.refuse) return { status: 409, json: { error: 'refused after writing' } };
          return { status: 201, json: { written: true } };
        },
      },
      {
        path: '/jobs', options: {
          scope: `${framework}.jobs`, mode: 'register',
          failedResponse: (error) => ({ status: 402, headers: { 'content-type': 'text/plain' }, body: Buffer.from(error) }),
        },
        handler: async ({ body, idempotency }) => {
          count(idempotency.key);
          if (body?.invalid) return { status: 400, json: { error: 'invalid' } };
          await enqueue(idempotency.client, `${framework}.jobs`, { key: idempotency.key, request: idempotency.request, body },
            { dedupKey: idempotency.key });
          return { status: 202, json: { accepted: idempotency.key } };
        },
      },
      {
        path: '/large', options: { scope: `${framework}.large` },
        handler: async ({ idempotency }) => {
          count(idempotency.key);
          return { status: 200, headers: { 'content-type': 'text/plain' }, body: Buffer.alloc(1200000, 'x') };
        },
      },
      {
        path: '/step-unstorable', options: { scope: `${framework}.step-unstorable` },
        handler: async ({ idempotency }) => {
          await idempotency.step('charge', async () => { count(idempotency.key); return { amount: 10n }; });
          return { status: 201, json: { charged: true } };
        },
      },
      {
        path: '/nul', options: { scope: `${framework}.nul` },
        handler: async ({ idempotency }) => ({
          status: 200, headers: { 'content-type': 'text/plain' }, body: Buffer.from(`a\u0000b${count(idempotency.key)}`),
        }),
      },
      {
        path: '/misclassified', options: { scope: `${framework}.misclassified`, classify: brokenClassify, onError },
        handler: async ({ idempotency }) => ({ status: 201, json: { run: count(idempotency.key) } }),
      },
      {
        path: '/misclassified-tx', options: { scope: `${framework}.misclassified`, mode: 'transaction', classify: brokenClassify, onError },
        handler: async ({ idempotency }) => ({ status: 201, json: { run: count(idempotency.key) } }),
      },
      {
        path: '/unrecorded', options: { scope: `${framework}.unrecorded`, pool: refusing, onError },
        handler: async ({ idempotency }) => ({ status: 201, json: { run: count(idempotency.key) } }),
      },
      {
        path: '/optional', options: { scope: `${framework}.optional`, required: false },
        handler: async () => ({ status: 200, json: { ok: true } }),
      },
    ];

    before(async () => {
      await pool.query('CREATE TABLE IF NOT EXISTS effects (key text, worker text)');
      server = await startServer(pool, routes);
    });
    after(async () => {
      await server.close();
      await pool.end();
    });

    const post = async (path, key, body, headers = {}) => {
      const res = await fetch(server.url + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}), ...headers },
        body: typeof body === 'string' ? body : JSON.stringify(body ?? {}),
      });
      const bytes = Buffer.from(await res.arrayBuffer());
      return { status: res.status, headers: res.headers, bytes, text: bytes.toString(), replayed: res.headers.get('idempotent-replayed') === 'true' };
    };

    test('no key: 400 with a problem document; the handler does not run', async () => {
      const answer = await post('/orders', null, { item: 'a' });
      assert.equal(answer.status, 400);
      assert.equal(answer.headers.get('content-type'), 'application/problem+json');
      assert.equal(JSON.parse(answer.text).status, 400);
    });

    test('no key on a route where it is optional: the handler runs', async () => {
      assert.equal((await post('/optional', null, {})).status, 200);
    });

    test('a repeat replays status, headers and body byte for byte, marked as a replay', async () => {
      const key = newKey();
      const first = await post('/orders', key, { item: 'a', qty: 2 });
      assert.equal(first.status, 201);
      assert.equal(first.replayed, false);
      const again = await post('/orders', key, { item: 'a', qty: 2 });
      assert.equal(again.status, 201);
      assert.equal(again.replayed, true);
      assert.equal(again.headers.get('x-order'), 'order-1');
      assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
      assert.ok(again.bytes.equals(first.bytes), `${again.text} != ${first.text}`);
      assert.equal(ran(key), 1);
    });

    test('a key sent as UTF-8 is stored as those characters, as a worker or the Go client would use it; other bytes: 400', async () => {
      const key = `ключ-${newKey()}-✓`;
      const header = Buffer.from(key, 'utf8').toString('latin1');   // the bytes on the wire
      const first = await post('/orders', header, { item: 'u' });
      assert.equal(first.status, 201);
      const { rows: [row] } = await pool.query('SELECT status::text FROM idempotency.idem_get($1, $2)', [key, `${framework}.orders`]);
      assert.equal(row?.status, 'COMPLETED');
      assert.equal((await post('/orders', header, { item: 'u' })).replayed, true);
      assert.equal(ran(key), 1);
      const latin = await post('/orders', 'caf\xe9', { item: 'l' });   // one byte 0xE9: not UTF-8
      assert.equal(latin.status, 400);
      assert.match(latin.text, /not UTF-8/);
    });

    test('the same JSON with other key order and spacing is the same request', async () => {
      const key = newKey();
      await post('/orders', key, '{"item": "a", "qty": 2}');
      const again = await post('/orders', key, '{"qty":2,"item":"a"}');
      assert.equal(again.replayed, true);
      assert.equal(ran(key), 1);
    });

    test('a repeat after the stored response expired: 410 problem naming the key; the handler does not run', async () => {
      const key = newKey();
      assert.equal((await post('/orders', key, { item: 'a' })).status, 201);
      await expireResult(key, `${framework}.orders`);
      const late = await post('/orders', key, { item: 'a' });
      assert.equal(late.status, 410);
      assert.equal(late.headers.get('content-type'), 'application/problem+json');
      const doc = JSON.parse(late.text);
      assert.equal(doc.status, 410);
      assert.equal(doc.idempotency_key, key);
      assert.match(doc.detail, new RegExp(`"${key}".*expired`));
      assert.equal((await post('/orders', key, { item: 'b' })).status, 422, 'another body is still a mismatch');
      assert.equal(ran(key), 1);
    });

    test('the key reused with another body, or on another path: 422', async () => {
      const key = newKey();
      await post('/orders', key, { item: 'a' });
      assert.equal((await post('/orders', key, { item: 'b' })).status, 422);
      assert.equal((await post('/waiting', key, { item: 'a' })).status, 422, 'same scope, other path');
      assert.equal(ran(key), 1);
    });

    test('concurrent duplicates: one handler execution, the others 409 with Retry-After or replayed', async () => {
      const key = newKey();
      const answers = await Promise.all(Array.from({ length: 10 }, () => post('/orders', key, { item: 'c', delay: 400 })));
      assert.equal(ran(key), 1);
      const original = answers.filter((a) => a.status === 201 && !a.replayed);
      const conflicts = answers.filter((a) => a.status === 409);
      const replays = answers.filter((a) => a.status === 201 && a.replayed);
      assert.equal(original.length, 1, answers.map((a) => a.status).join(','));
      assert.equal(conflicts.length + replays.length, 9);
      assert.ok(conflicts.length > 0, 'a 400 ms handler is seen in progress');
      for (const c of conflicts) assert.ok(Number(c.headers.get('retry-after')) >= 1);
      for (const r of replays) assert.ok(r.bytes.equals(original[0].bytes));
    });

    test('with wait, concurrent duplicates wait for the first and get its response', async () => {
      const key = newKey();
      const answers = await Promise.all(Array.from({ length: 6 }, () => post('/waiting', key, { delay: 300 })));
      assert.equal(ran(key), 1);
      assert.deepEqual(answers.map((a) => a.status), Array(6).fill(201));
      assert.equal(answers.filter((a) => !a.replayed).length, 1);
      assert.ok(answers.every((a) => a.bytes.equals(answers[0].bytes)));
    });

    test('a 5xx is retryable: not stored, the next request runs the handler again', async () => {
      const key = newKey();
      assert.equal((await post('/flaky', key, {})).status, 503);
      const retry = await post('/flaky', key, {});
      assert.equal(retry.status, 201);
      assert.equal(retry.replayed, false);
      assert.equal((await post('/flaky', key, {})).replayed, true);
      assert.equal(ran(key), 2);
    });

    test('steps: the retry of a multi-step handler resumes after the steps that finished', async () => {
      const key = newKey();
      assert.equal((await post('/steps', key, {})).status, 503);
      const retry = await post('/steps', key, {});
      assert.equal(retry.status, 201);
      const body = JSON.parse(retry.text);
      assert.deepEqual(body.resumed, ['reserve', 'charge']);
      assert.deepEqual(body.reserve, { reserved: 1 });
      assert.equal(body.charge.charge, body.stepKey);
      assert.equal(charges.get(body.stepKey), 1);
      const { rows: [{ sql }] } = await pool.query('SELECT idempotency.idem_step_key($1, $2, $3) AS sql',
        [key, 'charge', `${framework}.steps`]);
      assert.equal(body.stepKey, sql);
      const { rows: [{ n }] } = await pool.query(
        "SELECT count(*)::int AS n FROM effects WHERE key = $1 AND worker = 'reserve'", [key]);
      assert.equal(n, 1);
      assert.equal((await post('/steps', key, {})).replayed, true);
      assert.equal(ran(key), 2);
    });

    test('a handler that throws is retryable', async () => {
      const key = newKey();
      assert.equal((await post('/throws', key, {})).status, 500);
      assert.equal((await post('/throws', key, {})).status, 200);
      assert.equal(ran(key), 2);
    });

    test('a 4xx is a final failure: stored and replayed', async () => {
      const key = newKey();
      const first = await post('/declined', key, {});
      const again = await post('/declined', key, {});
      assert.equal(again.status, 402);
      assert.equal(again.replayed, true);
      assert.ok(again.bytes.equals(first.bytes));
      assert.equal(ran(key), 1);
      const { rows: [row] } = await pool.query('SELECT status::text FROM idempotency.idem_get($1, $2)', [key, `${framework}.declined`]);
      assert.equal(row.status, 'FAILED_FINAL');
    });

    test('the classify hook decides: a 503 made final is replayed', async () => {
      const key = newKey();
      await post('/classified', key, {});
      const again = await post('/classified', key, {});
      assert.equal(again.status, 503);
      assert.equal(again.replayed, true);
      assert.equal(ran(key), 1);
    });

    test('a step whose result cannot be stored fails the key for good: the step runs once', async () => {
      const key = newKey();
      assert.equal((await post('/step-unstorable', key, {})).status, 500);
      const { rows: [row] } = await pool.query('SELECT status::text FROM idempotency.idem_get($1, $2)', [key, `${framework}.step-unstorable`]);
      assert.equal(row?.status, 'FAILED_FINAL');
      const again = await post('/step-unstorable', key, {});
      assert.equal(again.status, 500);
      assert.equal(again.replayed, true);
      assert.equal(ran(key), 1);
    });

    test('a body with a NUL character is stored and replayed byte for byte', async () => {
      const key = newKey();
      const first = await post('/nul', key, {});
      assert.equal(first.status, 200);
      assert.ok(first.bytes.equals(Buffer.from('a\u0000b1')), first.text);
      const again = await post('/nul', key, {});
      assert.equal(again.replayed, true);
      assert.ok(again.bytes.equals(first.bytes));
      assert.equal(ran(key), 1);
    });

    for (const [mode, path] of [['claim', '/misclassified'], ['transaction', '/misclassified-tx']]) {
      test(`${mode} mode: a classify that throws: the default classification records the response, onError hears why`, async () => {
        const key = newKey();
        const first = await post(path, key, {});
        assert.equal(first.status, 201);
        const { rows: [row] } = await pool.query('SELECT status::text FROM idempotency.idem_get($1, $2)', [key, `${framework}.misclassified`]);
        assert.equal(row?.status, 'COMPLETED', 'not left PROCESSING (claim) or uncommitted (transaction)');
        const again = await post(path, key, {});
        assert.equal(again.replayed, true);
        assert.ok(again.bytes.equals(first.bytes));
        assert.equal(ran(key), 1);
        const heard = errors.find((e) => e.key === key);
        assert.equal(heard?.during, 'classify');
        assert.equal(heard.mode, mode);
        assert.match(String(heard.error?.message), /classify is broken/);
      });
    }

    test('a response that cannot be recorded: 500, and onError hears the database\'s error', async () => {
      const key = newKey();
      const first = await post('/unrecorded', key, {});
      assert.equal(first.status, 500);
      assert.match(first.text, /could not be recorded/);
      const heard = errors.find((e) => e.key === key);
      assert.equal(heard?.during, 'record');
      assert.equal(heard.error?.code, '42501');
    });

    test('a response larger than the server stores fails the key for good: the handler runs once', async () => {
      const key = newKey();
      const first = await post('/large', key, {});
      const { rows: [row] } = await pool.query('SELECT status::text FROM idempotency.idem_get($1, $2)', [key, `${framework}.large`]);
      assert.equal(row.status, 'FAILED_FINAL');
      const again = await post('/large', key, {});
      assert.equal(first.status, 500);
      assert.match(first.text, /larger than the server stores/);
      assert.equal(again.status, 500);
      assert.equal(again.replayed, true);
      assert.ok(again.bytes.equals(first.bytes));
      assert.equal(ran(key), 1);
    });

    test('a binary body is replayed byte for byte', async () => {
      const key = newKey();
      const first = await post('/binary', key, {});
      const again = await post('/binary', key, {});
      assert.ok(again.replayed);
      assert.ok(again.bytes.equals(Buffer.from([0, 255, 128, 10, 13])), again.bytes.toString('hex'));
      assert.ok(again.bytes.equals(first.bytes));
    });

    describe('transaction mode', () => {
      const written = async (key) => Number((await pool.query('SELECT count(*) FROM effects WHERE key = $1', [key])).rows[0].count);

      test('the handler\'s writes and the stored response commit together', async () => {
        const key = newKey();
        assert.equal((await post('/tx', key, {})).status, 201);
        assert.equal((await post('/tx', key, {})).replayed, true);
        assert.equal(await written(key), 1);
      });

      test('a retryable failure rolls back the writes and the claim', async () => {
        const key = newKey();
        assert.equal((await post('/tx', key, { fail: true })).status, 500);
        assert.equal(await written(key), 0);
        const { rows: [row] } = await pool.query('SELECT status FROM idempotency.idem_get($1, $2)', [key, `${framework}.tx`]);
        assert.equal(row.status, null, 'no key left behind');
      });

      test('a final failure rolls back the writes and keeps the response', async () => {
        const key = newKey();
        assert.equal((await post('/tx', key, { refuse: true })).status, 409);
        const again = await post('/tx', key, { refuse: true });
        assert.equal(again.status, 409);
        assert.equal(again.replayed, true);
        assert.equal(await written(key), 0);
      });

      test('concurrent duplicates: one execution, the others replayed or 409', async () => {
        const key = newKey();
        const answers = await Promise.all(Array.from({ length: 8 }, () => post('/tx', key, { delay: 300 })));
        assert.equal(ran(key), 1);
        assert.equal(await written(key), 1);
        assert.equal(answers.filter((a) => a.status === 201 && !a.replayed).length, 1);
        assert.ok(answers.every((a) => a.status === 409 || a.status === 201), answers.map((a) => a.status).join(','));
      });
    });

    describe('register mode', () => {
      const scope = `${framework}.jobs`;
      const work = (event, fn) => claim(pool, { key: event.payload.key, request: event.payload.request, scope }, fn);
      const nextJob = async (key) => {
        const { rows } = await pool.query(
          `SELECT id::text, payload FROM idempotency.outbox_claim('test', batch => 100, topics => ARRAY[$1])`, [scope]);
        return rows.find((r) => r.payload.key === key);
      };

      test('202 with one job; 409 until a worker completes; then the worker\'s result is replayed', async () => {
        const key = newKey();
        assert.equal((await post('/jobs', key, { amount: 5 })).status, 202);
        const queued = await post('/jobs', key, { amount: 5 });
        assert.equal(queued.status, 409);
        assert.equal((await post('/jobs', key, { amount: 6 })).status, 422);
        const event = await nextJob(key);
        assert.ok(event, 'the job was enqueued');
        const outcome = await work(event, async () => ({ paid: event.payload.body.amount }));
        assert.equal(outcome.outcome, 'completed');
        const done = await post('/jobs', key, { amount: 5 });
        assert.equal(done.status, 200);
        assert.equal(done.replayed, true);
        assert.deepEqual(JSON.parse(done.text), { paid: 5 });
        assert.equal(ran(key), 1);
      });

      test('a final failure of the worker is replayed through failedResponse', async () => {
        const key = newKey();
        await post('/jobs', key, { amount: 7 });
        const event = await nextJob(key);
        const { FinalError } = await import('../src/index.js');
        await work(event, async () => { throw new FinalError('insufficient funds'); });
        const answer = await post('/jobs', key, { amount: 7 });
        assert.equal(answer.status, 402);
        assert.equal(answer.text, 'insufficient funds');
        assert.equal(answer.replayed, true);
      });

      test('a rejected request registers nothing: the corrected request is accepted', async () => {
        const key = newKey();
        assert.equal((await post('/jobs', key, { invalid: true })).status, 400);
        assert.equal((await post('/jobs', key, { amount: 1 })).status, 202);
      });
    });
  });
}
