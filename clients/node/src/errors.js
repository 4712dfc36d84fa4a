// The errors a caller may throw or catch.

// Throw it from a job to fail the key for good (no retry). Any other error
// is retryable unless the `classify` option says otherwise.
export class FinalError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'FinalError';
    this.retryable = false;
  }
}

// The longest retry_in the extension takes: 36,000 days.
export const MAX_RETRY_IN = 36000 * 86400;

// A retryIn the extension takes (seconds from 0 to 36,000 days), or null.
export function retryInOrNull(value) {
  return typeof value === 'number' && value >= 0 && value <= MAX_RETRY_IN ? value : null;
}

// Throw it from a job to fail the key and ask for a retry after `retryIn`
// seconds (instead of the extension's backoff). A retryIn the extension
// would refuse is refused here, where its caller is.
export class RetryableError extends Error {
  constructor(message, { retryIn = null, ...options } = {}) {
    if (retryIn !== null && retryIn !== undefined && retryInOrNull(retryIn) === null) {
      throw new RangeError(`idempotency: retryIn must be a number of seconds from 0 to ${MAX_RETRY_IN} (36,000 days), not ${String(retryIn)}`);
    }
    super(message, options);
    this.name = 'RetryableError';
    this.retryable = true;
    this.retryIn = retryIn ?? null;
  }
}

// The longest error message stored (UTF-8 bytes): the server refuses one
// over idempotency.max_value_bytes (1 MB by default) with 22001.
export const MAX_ERROR_BYTES = 8192;

// What the work threw, as an error: a rejection with no reason (a bare
// reject(), throw undefined) or another falsy value is a failure too, not
// a success with no result.
export function thrown(err) {
  return err || new Error(`the work threw ${String(err) === '' ? 'an empty string' : String(err)}, not an Error`);
}

// An error's message as the extension stores it, rather than fail the
// record and leave the key held: text cannot hold NUL, which becomes
// U+FFFD, and a message over MAX_ERROR_BYTES is cut there (at a
// character's end) and says so.
export function errorText(error, fallback = '') {
  const text = String(error?.message ?? error ?? fallback).replaceAll('\u0000', '\uFFFD');
  const bytes = Buffer.byteLength(text);
  if (bytes <= MAX_ERROR_BYTES) return text;
  const note = ` [cut from ${bytes} bytes]`;
  // A character cut in two decodes as U+FFFD: dropped.
  const kept = Buffer.from(text).subarray(0, MAX_ERROR_BYTES - note.length).toString('utf8').replace(/\uFFFD$/, '');
  return kept + note;
}

// A result that is not JSON (a BigInt, a cycle), holds a string with a
// NUL character (PostgreSQL's jsonb cannot), or is larger than the server
// stores: nothing was recorded. It fails the key for good (retryable
// false): run again, the work would come to the same end.
export class UnstorableResult extends TypeError {
  constructor(cause, what = 'the result cannot be stored as JSON') {
    super(`${what}: ${cause?.message ?? cause}`);
    this.name = 'UnstorableResult';
    this.cause = cause;
    this.retryable = false;
  }
}

// IK001: the token is stale; the key (or lock) was taken over.
export function isStaleToken(err) {
  return err?.code === 'IK001';
}

// The default classification of a job's error: 'final' or 'retryable'.
export function defaultClassify(err) {
  return err?.retryable === false ? 'final' : 'retryable';
}

// classify(subject), or fallback(subject) when classify throws (report
// hears why): the key or event must still be recorded, or it would stay
// held and its work run again once the lease ended.
export function classifyOr(classify, fallback, subject, report) {
  try {
    return classify(subject);
  } catch (err) {
    report(err);
    return fallback(subject);
  }
}
