-- idem_fail: FAILED_RETRYABLE with backoff, retry_later, the retry claim,
-- FAILED_FINAL (not retryable or attempts exhausted), late failures, refusals.
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

-- ---------------------------------------------------------------- retryable
-- Backoff: retry_base_delay * 2^(attempt-1), capped at retry_max_delay, drawn
-- from the upper half of that delay (jitter).
SET idempotency.retry_base_delay = '10s';
SET idempotency.retry_max_delay = '30s';
SELECT * FROM pg_temp.show('b1', idempotency.idem_claim('fail-1', '{"job": 1}'));
SELECT idempotency.idem_fail('fail-1', pg_temp.tok('b1'), 'connection reset');
SELECT status, token = pg_temp.tok('b1') AS token_kept, attempts, last_error, lease_expired,
       next_attempt_at - updated_at BETWEEN '5s' AND '10s' AS backoff_1, expires_at
  FROM idempotency.idem_get('fail-1');
-- Before the backoff has passed: retry_later, retry_after = time left (no error given away).
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('fail-1', '{"job": 1}'));
SELECT retry_after > '4s' AND retry_after <= '10s' AS backoff_left
  FROM idempotency.idem_claim('fail-1');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('fail-1', '{"job": 2}'));
SELECT status, attempts FROM idempotency.idem_get('fail-1');
-- Second attempt's backoff doubles: [10s, 20s].
SELECT * FROM pg_temp.show('b2', idempotency.idem_claim('fail-2'));
SELECT idempotency.idem_fail('fail-2', pg_temp.tok('b2'), 'first', retry_in => '0');
-- retry_in = 0: claimable at once; the retry gets a new token and attempt 2.
SELECT * FROM pg_temp.show('b3', idempotency.idem_claim('fail-2'));
SELECT idempotency.idem_fail('fail-2', pg_temp.tok('b3'), 'second');
SELECT attempts, last_error, next_attempt_at - updated_at BETWEEN '10s' AND '20s' AS backoff_2
  FROM idempotency.idem_get('fail-2');
-- Third attempt: 40s capped at retry_max_delay 30s: [15s, 30s].
SELECT * FROM pg_temp.show('b4', idempotency.idem_claim('fail-3'));
SELECT idempotency.idem_fail('fail-3', pg_temp.tok('b4'), 'first', retry_in => '0');
SELECT * FROM pg_temp.show('b5', idempotency.idem_claim('fail-3'));
SELECT idempotency.idem_fail('fail-3', pg_temp.tok('b5'), 'second', retry_in => '0');
SELECT * FROM pg_temp.show('b6', idempotency.idem_claim('fail-3'));
SELECT idempotency.idem_fail('fail-3', pg_temp.tok('b6'), 'third');
SELECT attempts, next_attempt_at - updated_at BETWEEN '15s' AND '30s' AS backoff_3_capped
  FROM idempotency.idem_get('fail-3');
-- Jitter: workers that failed together do not all retry at the same moment.
CREATE TEMP TABLE jitter AS
SELECT n, (idempotency.idem_claim('fail-jitter-' || n)).token AS token FROM generate_series(1, 20) n;
SELECT count(*) FROM jitter j, idempotency.idem_fail('fail-jitter-' || j.n, j.token, 'same error') f
 WHERE f = 'FAILED_RETRYABLE';
SELECT count(DISTINCT k.next_attempt_at - k.updated_at) > 1 AS spread,
       bool_and(k.next_attempt_at - k.updated_at BETWEEN '5s' AND '10s') AS within_first_backoff
  FROM jitter j, idempotency.idem_get('fail-jitter-' || j.n) k;
-- retry_base_delay = 0: no backoff.
SET idempotency.retry_base_delay = 0;
SELECT * FROM pg_temp.show('b7', idempotency.idem_claim('fail-4'));
SELECT idempotency.idem_fail('fail-4', pg_temp.tok('b7'), 'no backoff');
SELECT * FROM pg_temp.show('b8', idempotency.idem_claim('fail-4'));
RESET idempotency.retry_base_delay;
RESET idempotency.retry_max_delay;
-- retry_in overrides the backoff.
SELECT * FROM pg_temp.show('b9', idempotency.idem_claim('fail-5'));
SELECT idempotency.idem_fail('fail-5', pg_temp.tok('b9'), 'rate limited', retry_in => '1 hour');
SELECT next_attempt_at - updated_at AS retry_in FROM idempotency.idem_get('fail-5');
SELECT retry_after > '59 min' AND retry_after <= '1 hour' AS backoff_left
  FROM idempotency.idem_claim('fail-5');
-- retryable NULL is refused like every other required argument (22004),
-- and changes nothing; omitted, it defaults to true.
SELECT * FROM pg_temp.show('b10', idempotency.idem_claim('fail-6'));
SELECT pg_temp.try($$SELECT idempotency.idem_fail('fail-6', pg_temp.tok('b10'), 'null retryable', NULL, '1 hour')$$);
SELECT status FROM idempotency.idem_get('fail-6');
SELECT idempotency.idem_fail('fail-6', pg_temp.tok('b10'), 'default retryable', retry_in => '1 hour');
-- A short backoff runs out: the key is claimed again (FAILED_RETRYABLE -> PROCESSING).
SELECT * FROM pg_temp.show('b11', idempotency.idem_claim('fail-7', lease => '1 min'));
SELECT idempotency.idem_fail('fail-7', pg_temp.tok('b11'), 'brief outage', retry_in => '0.4s');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('fail-7'));
SELECT pg_sleep(0.45);
SELECT * FROM pg_temp.show('b12', idempotency.idem_claim('fail-7'));
SELECT status, attempts, last_error, next_attempt_at, lease_until > clock_timestamp() AS leased
  FROM idempotency.idem_get('fail-7');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('fail-7', pg_temp.tok('b12'), '"second time lucky"'));

-- ---------------------------------------------------------------- final
-- Not retryable: FAILED_FINAL, retained like a completed key; claims answer failed.
SELECT * FROM pg_temp.show('d1', idempotency.idem_claim('final-1', '{"card": "4242"}'));
SELECT idempotency.idem_fail('final-1', pg_temp.tok('d1'), 'card declined', false);
SELECT status, attempts, last_error, next_attempt_at, expires_at - updated_at AS retained_for
  FROM idempotency.idem_get('final-1');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('final-1', '{"card": "4242"}'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('final-1', wait => '1s'));
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('final-1', '{"card": "1111"}'));
-- retry_in is ignored for a final failure.
SELECT * FROM pg_temp.show('d2', idempotency.idem_claim('final-2'));
SELECT idempotency.idem_fail('final-2', pg_temp.tok('d2'), 'bad input', false, '1 min');
SELECT status, next_attempt_at FROM idempotency.idem_get('final-2');
-- Attempts exhausted: with max_attempts = 2 the second failure is final
-- even though it is retryable (the dead letter).
SET idempotency.max_attempts = 2;
SET idempotency.retention = '1h';
SELECT * FROM pg_temp.show('d3', idempotency.idem_claim('final-3'));
SELECT idempotency.idem_fail('final-3', pg_temp.tok('d3'), 'attempt 1 failed', retry_in => '0');
SELECT * FROM pg_temp.show('d4', idempotency.idem_claim('final-3'));
SELECT idempotency.idem_fail('final-3', pg_temp.tok('d4'), 'attempt 2 failed', retry_in => '0');
SELECT status, attempts, last_error, expires_at - updated_at AS retained_for
  FROM idempotency.idem_get('final-3');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('final-3'));
RESET idempotency.max_attempts;
RESET idempotency.retention;

-- ---------------------------------------------------------------- refusals
SELECT pg_temp.try($$SELECT idempotency.idem_fail('fail-missing', 1, 'x')$$);
SELECT pg_temp.try($$SELECT idempotency.idem_fail('fail-1', pg_temp.tok('b9'), 'not mine')$$);
-- Token current, but the key is no longer PROCESSING: IK003.
SELECT pg_temp.try($$SELECT idempotency.idem_fail('fail-1', pg_temp.tok('b1'), 'twice')$$);
SELECT pg_temp.try($$SELECT idempotency.idem_fail('final-1', pg_temp.tok('d1'), 'again')$$);
SELECT pg_temp.try($$SELECT idempotency.idem_fail('fail-7', pg_temp.tok('b12'), 'after complete')$$);
-- Earlier tokens of a key are stale.
SELECT pg_temp.try($$SELECT idempotency.idem_fail('final-3', pg_temp.tok('d3'), 'old token')$$);
SELECT status, attempts, last_error FROM idempotency.idem_get('final-3');

-- ---------------------------------------------------------------- late failures
-- A holder whose lease ran out may still report its failure while the key
-- is PROCESSING; once the expiry is recorded, it is refused (IK003) and
-- changes nothing: a failed key does not fail again.
SELECT * FROM pg_temp.show('g1', idempotency.idem_claim('late-fail-1', lease => '0.2s'));
SELECT * FROM pg_temp.show('g2', idempotency.idem_claim('late-fail-2', lease => '0.2s'));
SELECT pg_sleep(0.3);
SELECT idempotency.idem_fail('late-fail-1', pg_temp.tok('g1'), 'late failure', retry_in => '1 min');
SELECT status, last_error, lease_expired FROM idempotency.idem_get('late-fail-1');
SELECT task, rows > 0 AS changed FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT status, last_error, lease_expired FROM idempotency.idem_get('late-fail-2');
SELECT pg_temp.try($$SELECT idempotency.idem_fail('late-fail-2', pg_temp.tok('g2'), 'late and final', retryable => false)$$);
SELECT status, last_error, lease_expired FROM idempotency.idem_get('late-fail-2');

-- ---------------------------------------------------------------- tokens grow
-- A key's next token is greater than its last also where token_seq was set
-- back below it (the keys' table restored without the sequence): the
-- sequence is moved past the key's token first ('new' below; before, the
-- retry got token 2).
SELECT * FROM pg_temp.show('t1', idempotency.idem_claim('token-grows'));
SELECT idempotency.idem_fail('token-grows', pg_temp.tok('t1'), 'again', retry_in => '0');
SELECT setval('idempotency.token_seq', 1);
SELECT * FROM pg_temp.show('t2', idempotency.idem_claim('token-grows'));
SELECT nextval('idempotency.token_seq') > pg_temp.tok('t2') AS sequence_past_it;
