// Types of pg-idempotency. Durations are in seconds.

/** What the client needs of a node-postgres client: pg.Client, pg.PoolClient. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** What the client needs of a pool: pg.Pool. */
export interface PoolLike extends Queryable {
  connect(): Promise<PoolClientLike>;
}

export interface PoolClientLike extends Queryable {
  release(err?: Error | boolean): void;
  on(event: 'notification', listener: (message: { channel: string; payload?: string }) => void): unknown;
  on(event: 'error', listener: (err: Error) => void): unknown;
}

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export type ErrorKind = 'retryable' | 'final';

export interface ClaimOptions {
  key: string;
  /** The request the key stands for; the same key with another request is a mismatch. */
  request?: Json;
  scope?: string;
  /** Lease of the claim, renewed every third of it while the work runs. Default 30. */
  lease?: number;
  /** Wait up to this long for another holder of the key to finish. */
  wait?: number | null;
  /** Renew the lease while the work runs. Default true. */
  heartbeat?: boolean;
  /** Which errors thrown by the work are final. Default: err.retryable === false. */
  classify?: (err: unknown) => ErrorKind;
  /** Aborting it ends a wait, and aborts job.signal while the work runs. */
  signal?: AbortSignal | null;
  /** A duplicate of finished work (completed, or failed for good) was answered. */
  onReplay?: (event: ClaimEvent) => void;
  /** The key was in progress or waiting for its retry. */
  onConflict?: (event: ClaimEvent & { retryAfter: number }) => void;
  /** The work's lease was lost and the key taken over: its result was not recorded. */
  onFenced?: (event: ClaimEvent & { error: string }) => void;
}

export interface ClaimEvent {
  key: string;
  scope: string;
  outcome: string;
}

/**
 * For a stopping server, once it stopped accepting requests: waits for a key
 * end at once, new requests get 503, running handlers and claims on this
 * pool have `timeout` seconds (10) to record their result; those still
 * running then have their signal aborted, their heartbeat stopped and their
 * key given back. Resolves when that is done.
 */
export declare function shutdown(pool: PoolLike, options?: { timeout?: number }): Promise<void>;

/** A claimed key, handed to the work function. */
/** A finished step of multi-step work: its place, the attempt that recorded it, its result. */
export interface FinishedStep {
  n: number;
  attempt: number;
  result: Json;
}

/** The key of a step's external call, as idem_step_key(key, step, scope) gives it. */
export declare function stepKey(scope: string, key: string, step: string): string;

export declare class Job {
  readonly key: string;
  readonly token: string;
  readonly scope: string;
  readonly attempt: number;
  readonly lease: number;
  /** Aborted when the heartbeat finds the lease lost. */
  readonly signal: AbortSignal | undefined;
  /** 'completed' or 'released' once recorded. */
  readonly finished: 'completed' | 'released' | null;
  /** When the lease ends at the latest (ms since the epoch), as the claim or the last heartbeat set it. */
  readonly leaseEnds: number;
  /** IK001 unless this job still holds the key; locks the key until the transaction ends. */
  fence(client: Queryable): Promise<void>;
  /** Stores the result, on `client` (inside its transaction) or on its own. */
  complete<T extends Json>(result?: T, client?: Queryable): Promise<T>;
  /** Fence, fn's writes and complete with fn's result, in one transaction. */
  transaction<T extends Json>(fn: (client: PoolClientLike) => Promise<T>): Promise<T>;
  /** Gives the key back without counting an attempt. */
  release(): Promise<void>;
  /** The steps finished so far (by earlier attempts, then this job), in their order. */
  readonly steps: Map<string, FinishedStep>;
  /** True when the claim resumed after steps an earlier attempt finished. */
  readonly resumed: boolean;
  /**
   * A step of multi-step work: its stored result when it finished before, else fn's,
   * recorded with idem_step in the transaction fn's writes on `client` are in.
   * `step.key` is the key to give the step's external call.
   */
  step<T extends Json>(name: string, fn: (client: PoolClientLike, step: { key: string }) => Promise<T>): Promise<T>;
  /** The key of a step's external call (idem_step_key). */
  stepKey(name: string): string;
}

export type ClaimResult<T = Json> =
  /** resultExpired: a duplicate answered from the key's tombstone; result (or error) is null, the work did not run. */
  | { outcome: 'completed'; result: T; replayed: boolean; resultExpired?: true }
  | { outcome: 'failed'; error: string; retryable: boolean; retryAfter: number | null; replayed: boolean; resultExpired?: true; cause?: unknown }
  | { outcome: 'in_progress' | 'retry_later'; retryAfter: number }
  | { outcome: 'mismatch' }
  | { outcome: 'fenced'; error: string }
  | { outcome: 'released' };

/**
 * Claims the key and runs work(job) under a heartbeat. Its return value is
 * stored with idem_complete unless it completed the key itself; a thrown
 * error fails the key (retryable or final); IK001 is `fenced`.
 */
export declare function claim<T extends Json>(
  pool: PoolLike, options: ClaimOptions, work: (job: Job) => Promise<T | void>): Promise<ClaimResult<T>>;

export interface EnqueueOptions {
  /** Events of one (topic, key) are handed out in order, one at a time. */
  key?: string | null;
  headers?: Json;
  /** Enqueue at most once per dedup key. */
  dedupKey?: string | null;
  deliverAt?: Date | string | null;
}

/** Enqueues in the transaction of `client`; resolves to the event id. */
export declare function enqueue(client: Queryable, topic: string, payload: Json, options?: EnqueueOptions): Promise<string>;

export interface OutboxEvent {
  id: string;
  topic: string;
  key: string | null;
  payload: any;
  headers: any;
  dedup_key: string | null;
  attempt: number;
}

export interface ConsumeOptions {
  topics?: string | string[] | null;
  /** The relay name recorded on claimed events (slot number appended). */
  name?: string;
  /** Events handled at once. Default 1. */
  concurrency?: number;
  /** Events claimed per slot at a time. Default 1. */
  batch?: number;
  /** Outbox lease of a claimed event. Default 60. */
  lease?: number;
  /** Seconds between polls when no notification arrives. Default 1. */
  pollInterval?: number;
  classify?: (err: unknown) => ErrorKind;
  onError?: (err: unknown) => void;
}

/**
 * ['nack', error, retryable, retryIn]; ['release', retryAfter]: another
 * worker holds the event's key (or its backoff runs), so the event is
 * held that long, then made pending again without counting an attempt.
 */
export type Settlement =
  | ['ack']
  | ['nack', string, boolean, number | null]
  | ['release', number | null | undefined]
  | ['leave'];

/**
 * What a consumer does with an event after its handler ran (or threw).
 * onError hears a classify that threw (the default classification applies).
 */
export declare function settlement(value: unknown, error: unknown, classify?: (err: unknown) => ErrorKind,
                                   onError?: (err: unknown) => void): Settlement;

export declare class Consumer {
  readonly done: Promise<void>;
  /** Finishes the events in hand, then resolves. */
  stop(): Promise<void>;
}

/**
 * Claims events and runs handler(event): a return acks it (a ClaimResult
 * is mapped: in progress is released after its retryAfter, retryable
 * failures nack with their delay, final failures and mismatches go to the
 * dead letters, fenced is left to its lease); a throw (also of no reason)
 * nacks it.
 */
export declare function consume(
  pool: PoolLike, options: ConsumeOptions, handler: (event: OutboxEvent) => Promise<unknown>): Consumer;

export declare class FinalError extends Error {
  readonly retryable: false;
}
export declare class RetryableError extends Error {
  constructor(message?: string, options?: { retryIn?: number | null; cause?: unknown });
  readonly retryable: true;
  readonly retryIn: number | null;
}
export declare function isStaleToken(err: unknown): boolean;
export declare function canonicalJson(value: unknown): string;
export declare function defaultFingerprint(request: { method: string; path: string; body: unknown }): Json;

/** A JSON response, for completedResponse and failedResponse. */
export declare function jsonResponse(status: number, value: unknown, headers?: Record<string, string>):
  { status: number; headers: Record<string, string>; body: Buffer };
/** An RFC 9457 problem document response. */
export declare function problem(status: number, title: string, detail: string, headers?: Record<string, string>):
  { status: number; headers: Record<string, string>; body: Buffer };

/** A pass of idem_maintenance(): rows is what each task changed. */
export interface MaintenanceTask { task: string; rows: number }
export interface MaintenanceOptions {
  /** Milliseconds between the end of a pass and the next (5000). */
  intervalMs?: number;
  onPass?: (tasks: MaintenanceTask[]) => void;
  /** A failed pass (default: a process warning); the next pass is still made. */
  onError?: (err: Error) => void;
}
/**
 * Calls idempotency.idem_maintenance() now and on an interval: the sweeps
 * of the SQL edition, which has no background workers
 * (docs/managed-postgres.md). The pool's role needs EXECUTE on it.
 */
export declare function startMaintenance(pool: PoolLike, options?: MaintenanceOptions): { stop(): Promise<void> };
