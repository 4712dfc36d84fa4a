// Options as the client takes them, checked when given rather than in
// every call that uses them.

// The options given a value: one given as undefined (or null) keeps its
// default, as an option left out does (lease: config.lease, unset).
export function given(options) {
  return Object.fromEntries(Object.entries(options ?? {}).filter(([, value]) => value !== undefined && value !== null));
}

// The bounds the extension puts on what it is given (docs/keys.md, 22023)
// whatever its settings: a value past them would fail every request or
// claim. retryIn's (36,000 days) is errors.js's MAX_RETRY_IN, beside the
// check of an error's own retryIn. A lease (and a wait) is also at most
// idempotency.max_lease (1 day by default), which a superuser may raise up
// to MAX_LEASE: only the server checks that.
export const MAX_LEASE = 2147483.647;        // seconds: the highest idempotency.max_lease
export const MAX_BATCH = 10000;              // outbox_claim's batch
// setTimeout's longest delay (about 24.8 days): past it, Node fires at once.
export const MAX_TIMER_MS = 2 ** 31 - 1;

// A duration option in seconds: a finite number from 0 (from a
// microsecond when positive) up to `most`; anything else would fail later,
// in every request.
export function checkSeconds(name, value, { positive = false, most = MAX_LEASE } = {}) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || (positive && value < 1e-6)
      || value > most) {
    throw new TypeError(`idempotency: ${name} must be a number of seconds from ${positive ? '1 µs' : '0'} to ${most.toLocaleString('en-US')}, not ${String(value)}`);
  }
}

// A whole-number option from `least` to `most`.
export function checkCount(name, value, least, most) {
  if (!Number.isInteger(value) || value < least || value > most) {
    throw new TypeError(`idempotency: ${name} must be a whole number from ${least} to ${most}, not ${String(value)}`);
  }
}
