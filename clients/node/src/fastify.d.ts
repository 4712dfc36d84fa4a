import type { FastifyPluginAsync } from 'fastify';
import type { IdempotencyContext, IdempotencyOptions } from './http.js';

export type { IdempotencyContext, IdempotencyOptions, IdempotentResponse, ResponseKind } from './http.js';

declare module 'fastify' {
  interface FastifyRequest {
    idempotency: IdempotencyContext | null;
  }
}

/** Fastify plugin for the Idempotency-Key header: covers the routes of the scope that registers it. */
export declare const idempotency: FastifyPluginAsync<IdempotencyOptions>;
export default idempotency;
