import type { FinishedStep, Json, PoolClientLike, PoolLike, Queryable } from './index.js';

/** A response as the middleware records and replays it. */
export interface IdempotentResponse {
  status: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: Buffer;
}

/** What completedResponse and failedResponse return: the body may be text. */
export interface ResponseInit {
  status: number;
  headers?: Record<string, string | string[]>;
  body?: Buffer | string;
}

export type ResponseKind = 'complete' | 'retryable' | 'final';

export interface IdempotencyOptions {
  pool: PoolLike;
  /** The kind of operation the keys name. Default 'default'. */
  scope?: string;
  /** Default 'claim'. */
  mode?: 'claim' | 'transaction' | 'register';
  /** Answer 400 to a request without the header. Default true. */
  required?: boolean;
  /** Methods covered. Default POST and PATCH. */
  methods?: string[];
  /** Default 'Idempotency-Key'. */
  header?: string;
  /** Set to "true" on replayed responses. Default 'Idempotent-Replayed'. */
  replayHeader?: string;
  /** Lease of the claim while the handler runs (claim mode). Default 30. */
  lease?: number;
  /** Wait up to this long for a concurrent request with the key instead of answering 409. Default 0. */
  wait?: number;
  /** When a retryable failure may run again. Default 0. */
  retryIn?: number;
  /** The request the key stands for. Default: method, path and a digest of the body. */
  fingerprint?: (request: { method: string; path: string; body: unknown }) => Json;
  /** Default: 2xx-3xx complete; 408, 425, 429, 5xx retryable; other 4xx final. */
  classify?: (response: IdempotentResponse) => ResponseKind;
  /** The response for a key completed with a result that is not a stored response (register mode: the worker's result). */
  completedResponse?: (result: Json) => ResponseInit;
  /** The response for a key that failed for good without a stored response. */
  failedResponse?: (error: string) => ResponseInit;
  /**
   * The response for a duplicate of a key whose stored response has expired (only
   * its tombstone is left; the handler never runs again). Default: 410 Gone with an
   * application/problem+json body naming the key.
   */
  expiredResponse?: (key: string) => ResponseInit;
  /** A stored response (or failure) was replayed; resultExpired when only the key's tombstone answered. */
  onReplay?: (event: IdempotencyEvent & { status: number; resultExpired?: true }) => void;
  /** A 409: the key is in progress (after `wait`) or waits for its retry. */
  onConflict?: (event: IdempotencyEvent & { status: 409; retryAfter: number }) => void;
  /** A 422: the key was used with another request. */
  onMismatch?: (event: IdempotencyEvent & { status: 422 }) => void;
  /** The handler's lease was lost (its heartbeat found out, or recording its response did). */
  onFenced?: (event: { key: string; scope: string; mode: string; error: string; during: 'heartbeat' | 'record' }) => void;
  /**
   * A `classify` that threw (the response was classified by default) or a
   * response that could not be recorded (answered 500). Default: console.error.
   */
  onError?: (event: { key: string; scope: string; mode: string; error: unknown; during: 'classify' | 'record' }) => void;
}

/** What the hooks are told. */
export interface IdempotencyEvent {
  key: string;
  scope: string;
  mode: 'claim' | 'transaction' | 'register';
  outcome: 'completed' | 'failed' | 'mismatch' | 'in_progress' | 'retry_later';
}

/** What the handler finds on the request while its key is claimed or registered. */
export interface IdempotencyContext {
  key: string;
  /** The fingerprint sent with the key: pass it to the worker in register mode. */
  request: Json;
  /** The claim's fencing token (claim and transaction modes). */
  token: string | null;
  attempt: number | null;
  /** The transaction the key lives in (transaction and register modes). */
  client: PoolClientLike | null;
  /** Aborted when the lease is lost (claim mode), the client went away, or a shutdown ended the request. */
  signal: AbortSignal;
  /** Fences a transaction of the handler's own (claim mode): IK001 once the key was taken over. */
  fence(client: Queryable): Promise<unknown>;
  /** The steps finished so far (by earlier attempts, then this request), in their order. */
  readonly steps: Map<string, FinishedStep>;
  /**
   * A step of multi-step work: its stored result when it finished before, else fn's,
   * recorded with idem_step in the transaction fn's writes are in (its own in claim
   * mode, the request's in transaction mode; not in register mode).
   */
  step<T extends Json>(name: string, fn: (client: PoolClientLike, step: { key: string }) => Promise<T>): Promise<T>;
  /** The key of a step's external call, as idem_step_key gives it. */
  stepKey(name: string): string;
}
