// Options as the client takes them, checked when given rather than in
// every call that uses them.

// The options given a value: one given as undefined (or null) keeps its
// default, as an option left out does (lease: config.lease, unset).
export function given(options) {
  return Object.fromEntries(Object.entries(options ?? {}).filter(([, value]) => value !== undefined && value !== null));
}

// A duration option in seconds: a finite number, at least 0 (above 0 when
// positive); anything else would fail later, in every request.
export function checkSeconds(name, value, { positive = false } = {}) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || (positive && value === 0)) {
    throw new TypeError(`idempotency: ${name} must be a finite number of seconds${positive ? ' above 0' : ''}, not ${String(value)}`);
  }
}
