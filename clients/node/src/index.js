// pg-idempotency: the idempotency PostgreSQL extension from Node.js.
export { claim, Job } from './claim.js';
export { enqueue, consume, Consumer, settlement } from './outbox.js';
export { FinalError, RetryableError, isStaleToken } from './errors.js';
export { canonicalJson, defaultFingerprint } from './fingerprint.js';
export { jsonResponse, problem } from './response.js';
export { shutdown } from './state.js';
export { stepKey } from './steps.js';
export { startMaintenance } from './maintenance.js';
