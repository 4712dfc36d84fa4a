-- idem_claim: every state a claim meets, fingerprints, leases, wait and the
-- in-transaction pattern.
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

-- ---------------------------------------------------------------- absent key
-- Absent -> PROCESSING: claimed, with a new token and attempt 1.
SELECT * FROM pg_temp.show('a1', idempotency.idem_claim('claim-1'));
SELECT scope, key, status, token = pg_temp.tok('a1') AS token_is_a1, attempts,
       lease_until > clock_timestamp() AS lease_live,
       lease_until <= clock_timestamp() + interval '30s' AS lease_within_default,
       next_attempt_at, fingerprint, result, last_error, job_ref,
       created_at = updated_at AS fresh, completed_at, expires_at
  FROM idempotency.idem_get('claim-1');
-- The default lease is idempotency.default_lease (30s).
SELECT lease_until - updated_at AS lease FROM idempotency.idem_get('claim-1');
-- A second claim while the lease lives: in_progress, retry_after = when the
-- holder is expected to be done, at most the lease left (sql/retry_estimate.sql).
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-1'));
SELECT retry_after > '0' AND retry_after <= '30s' AS within_the_lease
  FROM idempotency.idem_claim('claim-1');
-- An explicit lease.
SELECT * FROM pg_temp.show('a2', idempotency.idem_claim('claim-2', lease => '2 min'));
SELECT lease_until - updated_at AS lease FROM idempotency.idem_get('claim-2');
SELECT retry_after > '0' AND retry_after <= '2 min' AS within_the_lease
  FROM idempotency.idem_claim('claim-2');
-- idempotency.default_lease shapes the claims of this session.
SET idempotency.default_lease = '5s';
SELECT * FROM pg_temp.show('a3', idempotency.idem_claim('claim-3'));
SELECT lease_until - updated_at AS lease FROM idempotency.idem_get('claim-3');
RESET idempotency.default_lease;

-- Keys are unique per (scope, key): the same key in another scope is another key.
SELECT * FROM pg_temp.show('a4', idempotency.idem_claim('claim-1', scope => 'payment.capture'));
SELECT scope, status, attempts FROM idempotency.idem_get('claim-1', 'payment.capture');
SELECT scope, status, attempts FROM idempotency.idem_get('claim-1');
SELECT idempotency.idem_get('claim-1', 'email.welcome') IS NULL AS absent_elsewhere;

-- ---------------------------------------------------------------- COMPLETED
-- A duplicate of finished work replays the stored result.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('claim-1', pg_temp.tok('a1'), '{"charge": "ch_1"}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-1'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-1', wait => '5s'));
-- A COMPLETED key never goes back to PROCESSING.
SELECT status, token = pg_temp.tok('a1') AS token_is_a1, attempts FROM idempotency.idem_get('claim-1');

-- ---------------------------------------------------------------- fingerprints
SELECT * FROM pg_temp.show('f1', idempotency.idem_claim('claim-fp', '{"amount": 100, "currency": "EUR"}'));
-- Same request: the canonical jsonb text decides, not key order or spaces.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', '{"currency":"EUR","amount":100}'));
-- Another request under the same key: mismatch, nothing changes.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', '{"amount": 200, "currency": "EUR"}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', '[1, 2]'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', 'null'));
-- No request given: nothing to compare.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp'));
SELECT status, token = pg_temp.tok('f1') AS token_is_f1, attempts,
       fingerprint = sha256(('{"currency": "EUR", "amount": 100}'::jsonb)::text::bytea) AS sha256_of_canonical_text
  FROM idempotency.idem_get('claim-fp');
-- Mismatch also on a COMPLETED key (and the stored result is not given away).
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('claim-fp', pg_temp.tok('f1'), '"paid"'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', '{"amount": 200, "currency": "EUR"}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp', '{"amount": 100, "currency": "EUR"}'));
-- Requests equal as jsonb have one fingerprint: each number counts in its
-- shortest form (1500 and 1500.0, 1e3 and 1000), nested too.
SELECT '{"amount": 1500}'::jsonb = '{"amount": 1500.0}'::jsonb AS equal_as_jsonb;
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"amount": 1500, "items": [{"n": 1e3}]}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"amount": 1500.0, "items": [{"n": 1000}]}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"items": [{"n": 1000.000}], "amount": 15e2}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"amount": 1500.5, "items": [{"n": 1000}]}'));
-- A fingerprint stored before 0.4.0 hashed the request as written: a
-- duplicate written the same way still matches it.
UPDATE idempotency.idempotency_keys
   SET fingerprint = sha256(('{"amount": 1500.0}'::jsonb)::text::bytea)
 WHERE key = 'claim-fp3';
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"amount": 1500.0}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp3', '{"amount": 1501}'));
-- The fingerprint hashes the canonical text's own bytes, whatever they
-- hold: a backslash and a line break in a string are two characters of
-- its text like any other.
SELECT * FROM pg_temp.show('f4', idempotency.idem_claim('claim-fp4', jsonb_build_object('note', E'a\\b\nc')));
SELECT fingerprint = sha256(convert_to(jsonb_build_object('note', E'a\\b\nc')::text, 'UTF8')) AS sha256_of_text_bytes
  FROM idempotency.idem_get('claim-fp4');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp4', jsonb_build_object('note', E'a\\b\nc')));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp4', jsonb_build_object('note', E'a\\b\nd')));
-- A key claimed without a request keeps none; the first later claim that
-- brings one (and is granted) stores it.
SELECT * FROM pg_temp.show('f2', idempotency.idem_claim('claim-fp2'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp2', '{"a": 1}'));
SELECT fingerprint IS NULL AS no_fingerprint FROM idempotency.idem_get('claim-fp2');
SELECT idempotency.idem_fail('claim-fp2', pg_temp.tok('f2'), 'try again', retry_in => '0');
SELECT * FROM pg_temp.show('f3', idempotency.idem_claim('claim-fp2', '{"a": 1}'));
SELECT fingerprint IS NOT NULL AS has_fingerprint FROM idempotency.idem_get('claim-fp2');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp2', '{"a": 2}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-fp2', '{"a": 1}'));

-- ---------------------------------------------------------------- expired leases
-- claim-exp: a lease that runs out is taken over with a new token.
-- claim-final: with attempts exhausted the claim that finds it expired makes it FAILED_FINAL.
SELECT * FROM pg_temp.show('e1', idempotency.idem_claim('claim-exp', lease => '0.3s'));
SET idempotency.max_attempts = 1;
SELECT * FROM pg_temp.show('x1', idempotency.idem_claim('claim-final', lease => '0.3s'));
RESET idempotency.max_attempts;
-- wait: the caller waits for the holder's lease to end, then takes the key over.
SELECT * FROM pg_temp.show('w1', idempotency.idem_claim('claim-wait', lease => '0.5s'));
SELECT lease_until AS w1_until, clock_timestamp() AS wait_start FROM idempotency.idem_get('claim-wait') \gset
SELECT * FROM pg_temp.show('w2', idempotency.idem_claim('claim-wait', wait => '3s'));
SELECT clock_timestamp() >= :'w1_until'::timestamptz AS waited_for_the_lease,
       clock_timestamp() - :'wait_start'::timestamptz < '3s' AS not_until_the_end;
-- By now the 0.3s leases have run out.
SELECT pg_sleep(0.1);
SELECT lease_until < clock_timestamp() AS lease_over, status FROM idempotency.idem_get('claim-exp');
SELECT * FROM pg_temp.show('e2', idempotency.idem_claim('claim-exp'));
SELECT status, token = pg_temp.tok('e2') AS token_is_e2, attempts, last_error, lease_expired
  FROM idempotency.idem_get('claim-exp');
-- The old holder is fenced off.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('claim-exp', pg_temp.tok('e1'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('claim-exp', pg_temp.tok('e1'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_fail('claim-exp', pg_temp.tok('e1'), 'late')$$);
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('claim-exp', pg_temp.tok('e2'), '{"ok": true}'));
-- Attempts exhausted (max_attempts = 1): failed, FAILED_FINAL, 'lease expired'.
SET idempotency.max_attempts = 1;
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-final'));
RESET idempotency.max_attempts;
SELECT status, token = pg_temp.tok('x1') AS token_kept, attempts, last_error, lease_expired,
       expires_at > clock_timestamp() + interval '23 hours' AS retained
  FROM idempotency.idem_get('claim-final');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-final'));

-- wait that runs out: in_progress after waiting the whole wait.
SELECT * FROM pg_temp.show('w3', idempotency.idem_claim('claim-wait2', lease => '1 min'));
SELECT clock_timestamp() AS wait_start \gset
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-wait2', wait => '0.2s'));
SELECT clock_timestamp() - :'wait_start'::timestamptz >= '0.2s' AS waited_all;
-- wait does not wait for a backoff (retry_later) nor for a finished key.
SELECT idempotency.idem_fail('claim-wait2', pg_temp.tok('w3'), 'boom', retry_in => '1 min');
SELECT clock_timestamp() AS wait_start \gset
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-wait2', wait => '3s'));
SELECT clock_timestamp() - :'wait_start'::timestamptz < '2s' AS answered_at_once;

-- ---------------------------------------------------------------- transactions
-- The wall clock of the call decides the lease, not the transaction's start.
BEGIN;
SELECT pg_sleep(0.3);
SELECT * FROM pg_temp.show('t1', idempotency.idem_claim('claim-tx-clock', lease => '1s'));
SELECT lease_until - now() > '1.2s' AS uses_clock_timestamp FROM idempotency.idem_get('claim-tx-clock');
COMMIT;
-- A claim rolled back never happened.
BEGIN;
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-tx-rb'));
ROLLBACK;
SELECT idempotency.idem_get('claim-tx-rb') IS NULL AS absent;
-- Claim, business writes and complete commit or roll back together.
CREATE TEMP TABLE orders (id int);
BEGIN;
SELECT token AS tx_token FROM idempotency.idem_claim('claim-tx') \gset
INSERT INTO orders VALUES (1);
SELECT outcome, status FROM idempotency.idem_complete('claim-tx', :tx_token, '{"order": 1}');
ROLLBACK;
SELECT count(*) AS orders, idempotency.idem_get('claim-tx') IS NULL AS key_absent FROM orders;
BEGIN;
SELECT token AS tx_token FROM idempotency.idem_claim('claim-tx') \gset
INSERT INTO orders VALUES (1);
SELECT outcome, status FROM idempotency.idem_complete('claim-tx', :tx_token, '{"order": 1}');
COMMIT;
SELECT count(*) AS orders FROM orders;
SELECT outcome, status, token, attempt, result FROM idempotency.idem_claim('claim-tx');
-- Within one transaction the claim is seen by the same transaction's next claim.
BEGIN;
SELECT * FROM pg_temp.show('t2', idempotency.idem_claim('claim-tx2'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('claim-tx2'));
COMMIT;
-- Tokens only grow, across keys.
SELECT bool_and(token > 0) AS positive, count(*) = count(DISTINCT token) AS distinct_tokens FROM seen;
