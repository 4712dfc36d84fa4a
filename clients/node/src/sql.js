// The SQL the client runs: every call into the extension, in one place.
// Durations travel as seconds (float8) and become intervals here.
import { UnstorableResult } from './errors.js';

// JSON for a jsonb parameter. node-postgres would turn a JS array into a
// PostgreSQL array literal, so every value is serialised here.
export function jsonParam(value) {
  return value === undefined || value === null ? null : JSON.stringify(value);
}

// JSON's \u0000 escape, not preceded by an escaped backslash.
const NUL_ESCAPE = /(^|[^\\])(\\\\)*\\u0000/;

// A surrogate's escape: JSON.stringify writes a pair as the character and
// escapes a lone one (not UTF-8), which jsonb refuses.
const LONE_SURROGATE_ESCAPE = /(^|[^\\])(\\\\)*\\ud[89a-f][0-9a-f]{2}/;

// jsonParam of a result to store, or UnstorableResult.
export function storable(result) {
  let text;
  try {
    text = jsonParam(result);
  } catch (err) {
    throw new UnstorableResult(err);
  }
  if (text !== null && NUL_ESCAPE.test(text)) throw new UnstorableResult('a string holds a NUL character (\\u0000)');
  if (text !== null && LONE_SURROGATE_ESCAPE.test(text)) throw new UnstorableResult('a string holds a lone surrogate, which is not UTF-8');
  return text;
}

// result_expired (extension 0.7.0): the answer came from the key's
// tombstone, its result is gone (docs/keys.md#tombstones-the-dedup-window-outlives-the-result);
// steps (0.7.0): the finished steps of a resumed claim. Both are read from
// the outcome as JSON, so that a database whose extension is not updated
// yet answers false and NULL instead of failing every call.
const OUTCOME_COLUMNS = `outcome, status, token::text AS token, attempt, result, error,
       extract(epoch FROM retry_after)::float8 AS retry_after, job_ref,
       coalesce((to_jsonb(o) ->> 'result_expired')::boolean, false) AS result_expired,
       nullif(to_jsonb(o) -> 'steps', 'null') AS steps`;

export const CLAIM = `SELECT ${OUTCOME_COLUMNS}
  FROM idempotency.idem_claim($1, $2::jsonb, lease => make_interval(secs => $3::float8),
                              scope => $4, wait => make_interval(secs => $5::float8)) AS o`;

export const REGISTER = `SELECT ${OUTCOME_COLUMNS}
  FROM idempotency.idem_register($1, $2::jsonb, job_ref => $3, scope => $4) AS o`;

export const COMPLETE = `SELECT ${OUTCOME_COLUMNS}
  FROM idempotency.idem_complete($1, $2::bigint, $3::jsonb, scope => $4) AS o`;

// The failure and when the key may be claimed again (NULL once final).
export const FAIL = `SELECT idempotency.idem_fail($1, $2::bigint, $3, retryable => $4,
                                    retry_in => make_interval(secs => $5::float8), scope => $6) AS status`;
export const NEXT_ATTEMPT = `SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 AS retry_after
  FROM idempotency.idem_get($1, $2)`;

export const HEARTBEAT = `SELECT idempotency.idem_heartbeat($1, $2::bigint,
                                          extend => make_interval(secs => $3::float8), scope => $4)`;
export const RELEASE = 'SELECT idempotency.idem_release($1, $2::bigint, scope => $3)';
export const ASSERT_OWNER = 'SELECT idempotency.idem_assert_owner($1, $2::bigint, scope => $3)';
export const STEP = 'SELECT idempotency.idem_step($1, $2::bigint, $3, $4::jsonb, scope => $5) AS n';

export const ENQUEUE = `SELECT idempotency.outbox_enqueue($1, $2::jsonb, key => $3, headers => $4::jsonb,
                                      dedup_key => $5, deliver_at => $6::timestamptz)::text AS id`;
export const OUTBOX_CLAIM = `SELECT id::text AS id, topic, key, payload, headers, dedup_key, attempt
  FROM idempotency.outbox_claim($1, batch => $2, lease => make_interval(secs => $3::float8), topics => $4::text[])`;
export const OUTBOX_ACK = 'SELECT idempotency.outbox_ack(ARRAY[$1::bigint])';
export const OUTBOX_RELEASE = 'SELECT idempotency.outbox_release(ARRAY[$1::bigint], $2)';
export const OUTBOX_NACK = `SELECT idempotency.outbox_nack($1::bigint, $2, retryable => $3,
                                   retry_in => make_interval(secs => $4::float8))::text AS state`;
export const LISTEN = 'LISTEN idempotency_outbox';
// What a record whose answer was lost left (record.js).
export const KEY_RECORD = 'SELECT status::text AS status, token::text AS token, result FROM idempotency.idem_get($1, $2)';
export const BACKEND_PID = 'SELECT pg_catalog.pg_backend_pid() AS pid';
