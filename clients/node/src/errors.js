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

// Throw it from a job to fail the key and ask for a retry after `retryIn`
// seconds (instead of the extension's backoff).
export class RetryableError extends Error {
  constructor(message, { retryIn = null, ...options } = {}) {
    super(message, options);
    this.name = 'RetryableError';
    this.retryable = true;
    this.retryIn = retryIn;
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
