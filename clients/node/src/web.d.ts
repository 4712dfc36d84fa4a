import type { IdempotencyContext, IdempotencyOptions } from './http.js';

export type { IdempotencyContext, IdempotencyEvent, IdempotencyOptions, IdempotentResponse, ResponseKind } from './http.js';

/**
 * Wraps a web-standard handler (Request in, Response out: Next.js App Router
 * route handlers, Hono's c.req.raw, Bun.serve, Deno.serve) with the
 * Idempotency-Key header. The handler gets the same arguments; its
 * response is read whole, recorded, then returned.
 */
export declare function withIdempotency<Args extends unknown[]>(
  options: IdempotencyOptions,
  handler: (request: Request, ...rest: Args) => Response | Promise<Response>,
): (request: Request, ...rest: Args) => Promise<Response>;
export default withIdempotency;

/** The key's context while the wrapped handler runs on `request`, else null. */
export declare function idempotencyOf(request: Request): IdempotencyContext | null;
