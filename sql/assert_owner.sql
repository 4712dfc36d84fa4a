-- idem_assert_owner: the fence before business writes.
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

SELECT * FROM pg_temp.show('o1', idempotency.idem_claim('own-1'));
-- The current holder of a PROCESSING key passes (returns void).
SELECT idempotency.idem_assert_owner('own-1', pg_temp.tok('o1'));
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-1', pg_temp.tok('o1'))$$);
-- It locks the key's row for the rest of the transaction (xmax = this
-- transaction, a row lock), and nothing else changes.
BEGIN;
SELECT idempotency.idem_assert_owner('own-1', pg_temp.tok('o1'));
SELECT k.xmax::text = (pg_current_xact_id()::text::bigint % 4294967296)::text AS row_locked_by_me
  FROM idempotency.idempotency_keys k WHERE k.scope = 'default' AND k.key = 'own-1';
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('own-1', pg_temp.tok('o1'), '"fenced"'));
COMMIT;
SELECT status, result FROM idempotency.idem_get('own-1');
-- COMPLETED: the token is current but the key is not PROCESSING: IK001.
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-1', pg_temp.tok('o1'))$$);
-- IK002: the key does not exist.
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-missing', 1)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-1', pg_temp.tok('o1'), 'other.scope')$$);
-- IK001: a token that never was the key's.
SELECT * FROM pg_temp.show('o2', idempotency.idem_claim('own-2', scope => 'fence'));
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o1'), 'fence')$$);
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o2') + 1, 'fence')$$);
SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o2'), 'fence');
-- FAILED_RETRYABLE / FAILED_FINAL reported by the holder: IK001.
SELECT idempotency.idem_fail('own-2', pg_temp.tok('o2'), 'retry me', retry_in => '0', scope => 'fence');
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o2'), 'fence')$$);
SELECT * FROM pg_temp.show('o3', idempotency.idem_claim('own-2', scope => 'fence'));
-- An earlier attempt's token is stale once the key was claimed again.
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o2'), 'fence')$$);
SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o3'), 'fence');
SELECT idempotency.idem_fail('own-2', pg_temp.tok('o3'), 'give up', false, scope => 'fence');
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-2', pg_temp.tok('o3'), 'fence')$$);
-- A RECEIVED key has no holder.
SELECT outcome FROM idempotency.idem_register('own-3');
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('own-3', 1)$$);
CREATE TEMP TABLE shipments (id int);
SELECT * FROM pg_temp.show('o4', idempotency.idem_claim('own-4', lease => '0.2s'));
SELECT pg_sleep(0.3);
-- The lease ran out, but nobody claimed since and the key is still PROCESSING: passes.
SELECT idempotency.idem_assert_owner('own-4', pg_temp.tok('o4'));
-- Once the expiry is recorded the key is no longer PROCESSING: IK001.
SELECT task, rows > 0 AS changed FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT status FROM idempotency.idem_get('own-4');
-- The fence aborts the transaction, and the business writes with it.
\set VERBOSITY sqlstate
BEGIN;
INSERT INTO shipments VALUES (1);
SELECT idempotency.idem_assert_owner('own-4', pg_temp.tok('o4'));
INSERT INTO shipments VALUES (2);
COMMIT;
\set VERBOSITY default
SELECT count(*) AS shipments FROM shipments;
