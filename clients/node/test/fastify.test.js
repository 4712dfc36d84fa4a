import Fastify from 'fastify';
import { idempotency } from '../src/fastify.js';
import { httpSuite } from './http-suite.js';

httpSuite('fastify', async (pool, routes) => {
  const app = Fastify();
  for (const { path, options, handler } of routes) {
    app.register(async (scope) => {
      await scope.register(idempotency, { pool, ...options });
      scope.post(path, async (request, reply) => {
        const { status, headers = {}, json, body } = await handler({ body: request.body, idempotency: request.idempotency });
        reply.code(status).headers(headers);
        return json !== undefined ? json : body;
      });
    });
  }
  const address = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: address, close: () => app.close() };
});
