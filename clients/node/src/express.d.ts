import type { RequestHandler } from 'express';
import type { IdempotencyContext, IdempotencyOptions } from './http.js';

export type { IdempotencyContext, IdempotencyOptions, IdempotentResponse, ResponseKind } from './http.js';

declare global {
  namespace Express {
    interface Request {
      idempotency?: IdempotencyContext;
    }
  }
}

/** Express middleware for the Idempotency-Key header; mount it after the body parser. */
export declare function idempotency(options: IdempotencyOptions): RequestHandler;
