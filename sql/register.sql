-- idem_register: ingress dedup at the API, in every state of the key.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message' (tokens masked).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g');
END $f$;
-- Tokens this session has seen, by label. show(label, outcome) prints an
-- outcome with its token as 'new' (greater than every token seen so far; it
-- is then remembered under label) or '=label', and retry_after as its sign.
CREATE TEMP TABLE seen (label text PRIMARY KEY, token bigint NOT NULL);
CREATE FUNCTION pg_temp.tok(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT token FROM seen WHERE label = l $f$;
CREATE FUNCTION pg_temp.show(l text, r idempotency.idem_outcome)
RETURNS TABLE (outcome text, status idempotency.idem_status, token text, attempt int,
               result jsonb, error text, retry_after text, job_ref text)
LANGUAGE plpgsql AS $f$
DECLARE
    known text;
BEGIN
    SELECT string_agg(s.label, ',' ORDER BY s.label) INTO known FROM seen s WHERE s.token = r.token;
    outcome := r.outcome; status := r.status; attempt := r.attempt;
    result := r.result; error := r.error; job_ref := r.job_ref;
    token := CASE WHEN r.token IS NULL THEN NULL
                  WHEN known IS NOT NULL THEN '=' || known
                  WHEN r.token > (SELECT coalesce(max(s.token), 0) FROM seen s) THEN 'new'
                  ELSE 'old, unseen' END;
    IF r.token IS NOT NULL AND known IS NULL AND l IS NOT NULL THEN
        INSERT INTO seen VALUES (l, r.token);
    END IF;
    retry_after := CASE WHEN r.retry_after IS NULL THEN NULL
                        WHEN r.retry_after = '0' THEN '0'
                        WHEN r.retry_after > '0' THEN 'positive'
                        ELSE 'negative' END;
    RETURN NEXT;
END $f$;

-- (none) -> RECEIVED: registered, no token, attempt 0, the job_ref given.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 7}', 'job-7'));
SELECT status, token, attempts, lease_until, next_attempt_at, fingerprint IS NOT NULL AS has_fingerprint,
       job_ref, result, last_error, created_at = updated_at AS fresh, expires_at
  FROM idempotency.idem_get('reg-1');
-- A duplicate while RECEIVED (queued): in_progress with the stored job_ref and
-- a zero retry_after (no lease left to wait for); a new job_ref changes nothing.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 7}', 'job-other'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1'));
-- A different request: mismatch.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 8}', 'job-8'));
-- claim of a RECEIVED key with a different request: mismatch, still RECEIVED.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('reg-1', '{"order": 8}'));
SELECT status, attempts, job_ref FROM idempotency.idem_get('reg-1');

-- RECEIVED -> PROCESSING: the worker claims it; the outcome carries the job_ref.
SELECT * FROM pg_temp.show('r1', idempotency.idem_claim('reg-1', '{"order": 7}', lease => '1 min'));
-- register while PROCESSING: in_progress, retry_after = when the holder is
-- expected to be done, at most the lease left.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 7}'));
SELECT retry_after > '0' AND retry_after <= '1 min' AS within_the_lease
  FROM idempotency.idem_register('reg-1', '{"order": 7}');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 8}'));

-- FAILED_RETRYABLE: in_progress (the key will be retried), retry_after = backoff left.
SELECT idempotency.idem_fail('reg-1', pg_temp.tok('r1'), 'gateway timeout', retry_in => '10 min');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 7}'));
SELECT retry_after > '9 min' AND retry_after <= '10 min' AS backoff_left
  FROM idempotency.idem_register('reg-1');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-1', '{"order": 8}'));

-- COMPLETED: completed with the stored result.
SELECT * FROM pg_temp.show('r2', idempotency.idem_register('reg-2', NULL, 'job-2'));
SELECT * FROM pg_temp.show('r2', idempotency.idem_claim('reg-2'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('reg-2', pg_temp.tok('r2'), '{"status": 201}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-2', NULL, 'job-again'));
-- The key was registered without a request: any request is accepted.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-2', '{"any": "thing"}'));

-- FAILED_FINAL: failed with the last error.
SELECT * FROM pg_temp.show('r3', idempotency.idem_claim('reg-3', '{"x": 1}'));
SELECT idempotency.idem_fail('reg-3', pg_temp.tok('r3'), 'card declined', retryable => false);
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-3', '{"x": 1}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-3', '{"x": 2}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-3'));

-- A key created by claim has no job_ref; register reports it as it is.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-3', NULL, 'job-3'));
SELECT job_ref IS NULL AS no_job_ref FROM idempotency.idem_get('reg-3');

-- job_ref may be empty; all optional arguments may be NULL.
SELECT outcome, job_ref = '' AS empty_job_ref FROM idempotency.idem_register('reg-4', NULL, '');
SELECT job_ref = '' AS empty_job_ref FROM idempotency.idem_get('reg-4');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-5', NULL, NULL, 'email.welcome'));
SELECT scope, status, job_ref IS NULL AS no_job_ref FROM idempotency.idem_get('reg-5', 'email.welcome');
SELECT idempotency.idem_get('reg-5') IS NULL AS not_in_default_scope;

-- register never changes an existing key.
SELECT status, attempts, job_ref, last_error FROM idempotency.idem_get('reg-1');

-- A register rolled back with its transaction leaves nothing (the enqueue
-- of the job and the key commit together).
BEGIN;
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('reg-6', NULL, 'job-6'));
ROLLBACK;
SELECT idempotency.idem_get('reg-6') IS NULL AS absent;
