-- idem_complete: PROCESSING -> COMPLETED, retention, idempotent replays, late
-- completes and every refusal (IK001, IK002, IK003).
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

-- PROCESSING -> COMPLETED with the result; expires_at = now + idempotency.retention (24h).
SELECT * FROM pg_temp.show('c1', idempotency.idem_claim('done-1'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('done-1', pg_temp.tok('c1'), '{"receipt": "r-1"}'));
SELECT status, token = pg_temp.tok('c1') AS token_is_c1, attempts, result,
       completed_at IS NOT NULL AS has_completed_at, completed_at = updated_at AS state_changed_then,
       expires_at - completed_at AS retained_for, next_attempt_at, lease_until IS NOT NULL AS lease_kept
  FROM idempotency.idem_get('done-1');
-- Complete is itself idempotent: the same token again replays the stored
-- outcome and changes nothing (the new result is ignored).
SELECT updated_at AS done_at FROM idempotency.idem_get('done-1') \gset
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('done-1', pg_temp.tok('c1'), '{"receipt": "other"}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('done-1', pg_temp.tok('c1')));
SELECT result, updated_at = :'done_at' AS unchanged FROM idempotency.idem_get('done-1');

-- retain overrides the retention; zero is allowed.
SELECT * FROM pg_temp.show('c2', idempotency.idem_claim('done-2'));
SELECT outcome FROM idempotency.idem_complete('done-2', pg_temp.tok('c2'), retain => '1 hour');
SELECT expires_at - completed_at AS retained_for FROM idempotency.idem_get('done-2');
SELECT * FROM pg_temp.show('c3', idempotency.idem_claim('done-3'));
SELECT outcome FROM idempotency.idem_complete('done-3', pg_temp.tok('c3'), retain => '0');
SELECT expires_at - completed_at AS retained_for FROM idempotency.idem_get('done-3');
SELECT * FROM pg_temp.show('c4', idempotency.idem_claim('done-4'));
SELECT outcome FROM idempotency.idem_complete('done-4', pg_temp.tok('c4'), retain => '100 years');
SELECT expires_at - completed_at AS retained_for FROM idempotency.idem_get('done-4');
-- idempotency.retention is the default.
SET idempotency.retention = '2h';
SELECT * FROM pg_temp.show('c5', idempotency.idem_claim('done-5'));
SELECT outcome FROM idempotency.idem_complete('done-5', pg_temp.tok('c5'));
SELECT expires_at - completed_at AS retained_for FROM idempotency.idem_get('done-5');
RESET idempotency.retention;

-- A NULL result is a result: duplicates replay it as NULL.
SELECT * FROM pg_temp.show('c6', idempotency.idem_claim('done-6', scope => 'email.welcome'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('done-6', pg_temp.tok('c6'), NULL, 'email.welcome'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('done-6', scope => 'email.welcome'));
-- The scope is part of the key.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-6', pg_temp.tok('c6'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-6', pg_temp.tok('c6'), scope => 'email.other')$$);

-- ---------------------------------------------------------------- refusals
-- IK002: the key does not exist.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-missing', 1)$$);
-- IK001: a token that never was the key's.
SELECT * FROM pg_temp.show('c7', idempotency.idem_claim('done-7'));
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-7', pg_temp.tok('c7') + 1000000)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-7', pg_temp.tok('c1'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-7', 0)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-7', -1)$$);
SELECT status FROM idempotency.idem_get('done-7');
-- IK001 on a COMPLETED key for any other token.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-1', pg_temp.tok('c7'))$$);
-- IK003: the token is current but the holder failed the key itself.
SELECT idempotency.idem_fail('done-7', pg_temp.tok('c7'), 'fatal', retryable => false);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-7', pg_temp.tok('c7'))$$);
SELECT * FROM pg_temp.show('c8', idempotency.idem_claim('done-8'));
SELECT idempotency.idem_fail('done-8', pg_temp.tok('c8'), 'transient', retry_in => '1 hour');
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-8', pg_temp.tok('c8'))$$);
SELECT status, result FROM idempotency.idem_get('done-8');
-- IK001: released (a registered key goes back to RECEIVED).
SELECT outcome FROM idempotency.idem_register('done-9');
SELECT * FROM pg_temp.show('c9', idempotency.idem_claim('done-9'));
SELECT idempotency.idem_release('done-9', pg_temp.tok('c9'));
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-9', pg_temp.tok('c9'))$$);
-- ... and IK002 when the release removed the key.
SELECT * FROM pg_temp.show('c10', idempotency.idem_claim('done-10'));
SELECT idempotency.idem_release('done-10', pg_temp.tok('c10'));
SELECT pg_temp.try($$SELECT idempotency.idem_complete('done-10', pg_temp.tok('c10'))$$);
-- The error aborts the caller's transaction, and its business writes with it.
CREATE TEMP TABLE ledger (entry text);
\set VERBOSITY sqlstate
BEGIN;
INSERT INTO ledger VALUES ('charged');
SELECT idempotency.idem_complete('done-7', pg_temp.tok('c7'));
COMMIT;
\set VERBOSITY default
SELECT count(*) AS ledger_entries FROM ledger;

-- ---------------------------------------------------------------- late completes
-- A holder whose lease ran out completes before anyone claims again:
-- accepted, whether the expiry was not yet noticed (still PROCESSING) or was
-- recorded (FAILED_RETRYABLE, or FAILED_FINAL when attempts are exhausted).
SELECT * FROM pg_temp.show('l1', idempotency.idem_claim('late-1', lease => '0.2s'));
SELECT * FROM pg_temp.show('l2', idempotency.idem_claim('late-2', lease => '0.2s'));
SET idempotency.max_attempts = 1;  -- recorded by the claim, for its expiry
SELECT * FROM pg_temp.show('l3', idempotency.idem_claim('late-3', lease => '0.2s'));
RESET idempotency.max_attempts;
SELECT * FROM pg_temp.show('l4', idempotency.idem_claim('late-4', lease => '0.2s'));
SELECT pg_sleep(0.3);
SELECT status, lease_until < clock_timestamp() AS lease_over FROM idempotency.idem_get('late-1');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('late-1', pg_temp.tok('l1'), '"late but fine"'));
-- late-3: attempts exhausted (its claim recorded max_attempts = 1, whatever
-- this session's setting now): a claim finds the lease over and records
-- FAILED_FINAL; the holder's complete still counts.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('late-3'));
SELECT status, last_error, lease_expired FROM idempotency.idem_get('late-3');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('late-3', pg_temp.tok('l3'), '"late"'));
SELECT status, result, expires_at - completed_at AS retained_for FROM idempotency.idem_get('late-3');
-- late-2: the expiry is recorded by idem_maintenance (the worker's sweep).
SELECT task, rows > 0 AS changed FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT status, last_error, lease_expired FROM idempotency.idem_get('late-2');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('late-2', pg_temp.tok('l2'), '"late"'));
SELECT status, result, lease_expired, expires_at - completed_at AS retained_for
  FROM idempotency.idem_get('late-2');
-- late-4: someone claimed since: the late complete is refused with IK001.
SELECT status FROM idempotency.idem_get('late-4');
SELECT * FROM pg_temp.show('l4b', idempotency.idem_claim('late-4'));
SELECT pg_temp.try($$SELECT idempotency.idem_complete('late-4', pg_temp.tok('l4'), '"too late"')$$);
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('late-4', pg_temp.tok('l4b'), '"second worker"'));
SELECT status, attempts, result FROM idempotency.idem_get('late-4');
