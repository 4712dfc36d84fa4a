package idempotency

// The SQL the client runs: every call into the extension, in one place.
// Durations travel as seconds (float8) and become intervals here; tokens
// as bigint; JSON as text cast to jsonb. Placeholders are $n, which every
// PostgreSQL driver for database/sql accepts.

// result_expired (extension 0.7.0): the answer came from the key's
// tombstone; the result is gone and the work is never run again. steps
// (0.7.0): the finished steps of a resumed claim. Both are read from the
// outcome as JSON, so that a database whose extension is not updated yet
// answers false and NULL instead of failing every call.
const outcomeColumns = `outcome::text, status::text, token, attempt, result::text, error,
       extract(epoch FROM retry_after)::float8,
       coalesce((to_jsonb(o) ->> 'result_expired')::boolean, false), nullif(to_jsonb(o) -> 'steps', 'null')::text`

const sqlClaim = `SELECT ` + outcomeColumns + `
  FROM idempotency.idem_claim($1, $2::jsonb, lease => make_interval(secs => $3::float8), scope => $4) AS o`

// job_ref is the key: the job the handler enqueues carries it.
const sqlRegister = `SELECT ` + outcomeColumns + `
  FROM idempotency.idem_register($1, $2::jsonb, job_ref => $3, scope => $4) AS o`

// The result as the key stores it (jsonb's text), as duplicates get it.
const sqlComplete = `SELECT result::text
  FROM idempotency.idem_complete($1, $2::bigint, $3::jsonb, scope => $4)`

// The failure and when the key may be claimed again (NULL once final).
const sqlFail = `SELECT idempotency.idem_fail($1, $2::bigint, $3, retryable => $4,
                       retry_in => make_interval(secs => $5::float8), scope => $6)::text`

const sqlNextAttempt = `SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8
  FROM idempotency.idem_get($1, $2)`

// What a record whose answer was lost left (record.go).
const sqlKeyRecord = `SELECT status::text, token, result::text FROM idempotency.idem_get($1, $2)`

const sqlHeartbeat = `SELECT idempotency.idem_heartbeat($1, $2::bigint,
                             extend => make_interval(secs => $3::float8), scope => $4)`

const sqlRelease = `SELECT idempotency.idem_release($1, $2::bigint, scope => $3)`

const sqlStepRecorded = `SELECT ((idempotency.idem_get($1, $2)).steps -> $3)::text`
const sqlAssertOwner = `SELECT idempotency.idem_assert_owner($1, $2::bigint, scope => $3)`

// A finished step of multi-step work, recorded in the step's transaction.
const sqlStep = `SELECT idempotency.idem_step($1, $2::bigint, $3, $4::jsonb, scope => $5)`

const sqlEnqueue = `SELECT idempotency.outbox_enqueue($1, $2::jsonb, key => $3, headers => $4::jsonb,
                           dedup_key => $5)`

const sqlOutboxClaim = `SELECT id, topic, key, payload::text, headers::text, dedup_key, attempt
  FROM idempotency.outbox_claim($1, batch => $2, lease => make_interval(secs => $3::float8),
                                topics => (SELECT array_agg(t) FROM jsonb_array_elements_text($4::jsonb) AS t))`

const sqlOutboxAck = `SELECT idempotency.outbox_ack(ARRAY[$1::bigint])`

const sqlOutboxNack = `SELECT idempotency.outbox_nack($1::bigint, $2, retryable => $3,
                             retry_in => make_interval(secs => $4::float8))::text`

// Topics travel as a JSON array (database/sql has no portable array
// parameter); NULL means every topic the role may claim.

// Events claimed but not started when the consumer stops go back at once.
const sqlOutboxRelease = `SELECT idempotency.outbox_release(ARRAY[$1::bigint], $2)`

// One pass of the background workers' sweeps (rows: what each task changed).
const sqlMaintenance = `SELECT task, rows FROM idempotency.idem_maintenance()`
