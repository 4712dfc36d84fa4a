-- idem_heartbeat and idem_release.
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

-- ---------------------------------------------------------------- heartbeat
-- Extends a live lease: returns the new lease_until (now + extend).
SELECT * FROM pg_temp.show('h1', idempotency.idem_claim('hb-1', lease => '2s'));
SELECT idempotency.idem_heartbeat('hb-1', pg_temp.tok('h1'), '1 min') AS hb \gset
SELECT :'hb'::timestamptz > clock_timestamp() + interval '50s' AS extended,
       :'hb'::timestamptz <= clock_timestamp() + interval '1 min' AS not_beyond;
SELECT status, lease_until = :'hb'::timestamptz AS stored, token = pg_temp.tok('h1') AS same_token,
       attempts, updated_at < lease_until - interval '50s' AS state_unchanged
  FROM idempotency.idem_get('hb-1');
-- extend defaults to idempotency.default_lease.
SET idempotency.default_lease = '10 min';
SELECT idempotency.idem_heartbeat('hb-1', pg_temp.tok('h1')) AS hb \gset
RESET idempotency.default_lease;
SELECT :'hb'::timestamptz > clock_timestamp() + interval '9 min' AS default_extend,
       lease_until = :'hb'::timestamptz AS stored
  FROM idempotency.idem_get('hb-1');
-- A heartbeat may also shorten the lease: it sets now + extend.
SELECT idempotency.idem_heartbeat('hb-1', pg_temp.tok('h1'), '5s') <= clock_timestamp() + interval '5s' AS shortened;
-- Competing claims see the extended lease.
SELECT outcome, retry_after > '0' AND retry_after <= '5s' AS lease_left FROM idempotency.idem_claim('hb-1');
-- A renewal slowed by a busy server (here by a user's BEFORE UPDATE trigger
-- that takes 50 ms) writes the row once: only one that took a tenth of its
-- extension (at least 10 ms) waited for the row, and is made again from
-- when it got it (isolation test heartbeat_after_fence).
CREATE TABLE hb_writes (lease_until timestamptz);
CREATE FUNCTION hb_slow_write() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.key = 'hb-slow' THEN
        INSERT INTO public.hb_writes VALUES (NEW.lease_until);
        PERFORM pg_sleep(0.05);
    END IF;
    RETURN NEW;
END $f$;
CREATE TRIGGER hb_slow BEFORE UPDATE ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION hb_slow_write();
SELECT * FROM pg_temp.show('h9', idempotency.idem_claim('hb-slow', lease => '1 min'));
SELECT idempotency.idem_heartbeat('hb-slow', pg_temp.tok('h9'), '1 hour') > clock_timestamp() + interval '59 min' AS renewed;
SELECT count(*) AS writes_for_one_hour FROM hb_writes;
DROP TRIGGER hb_slow ON idempotency.idempotency_keys;
DROP FUNCTION hb_slow_write();
DROP TABLE hb_writes;
-- Refusals: IK002 unknown key, IK001 a token that is not the key's.
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-missing', 1)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-1', pg_temp.tok('h1') + 1000000)$$);
-- IK003: the token is current but the holder finished the key itself.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('hb-1', pg_temp.tok('h1')));
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-1', pg_temp.tok('h1'))$$);
SELECT * FROM pg_temp.show('h2', idempotency.idem_claim('hb-2'));
SELECT idempotency.idem_fail('hb-2', pg_temp.tok('h2'), 'oops', retry_in => '1 hour');
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-2', pg_temp.tok('h2'))$$);
SELECT * FROM pg_temp.show('h3', idempotency.idem_claim('hb-3'));
SELECT idempotency.idem_fail('hb-3', pg_temp.tok('h3'), 'fatal', retryable => false);
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-3', pg_temp.tok('h3'))$$);

-- Late heartbeats: a holder whose lease ran out keeps its key only while
-- the key is still PROCESSING; once an expiry is recorded (FAILED_RETRYABLE
-- or FAILED_FINAL), a heartbeat is refused with IK003 and changes nothing.
SELECT * FROM pg_temp.show('h4', idempotency.idem_claim('hb-late-1', lease => '0.2s'));
SELECT * FROM pg_temp.show('h5', idempotency.idem_claim('hb-late-2', lease => '0.2s'));
SET idempotency.max_attempts = 1;  -- recorded by the claim: its expiry is final
SELECT * FROM pg_temp.show('h6', idempotency.idem_claim('hb-late-3', lease => '0.2s'));
RESET idempotency.max_attempts;
SELECT * FROM pg_temp.show('h7', idempotency.idem_claim('hb-late-4', lease => '0.2s'));
SELECT pg_sleep(0.3);
-- Not yet recorded: still PROCESSING.
SELECT idempotency.idem_heartbeat('hb-late-1', pg_temp.tok('h4'), '1 min') > clock_timestamp() AS renewed;
SELECT status, lease_until > clock_timestamp() + interval '50s' AS leased FROM idempotency.idem_get('hb-late-1');
-- Recorded as FAILED_FINAL by a claim that found the attempts exhausted.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('hb-late-3'));
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-late-3', pg_temp.tok('h6'), '1 min')$$);
SELECT status, lease_expired, expires_at IS NOT NULL AS retained FROM idempotency.idem_get('hb-late-3');
-- Recorded as FAILED_RETRYABLE by the sweep.
SELECT task, rows > 0 AS changed FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT status, last_error, lease_expired FROM idempotency.idem_get('hb-late-2');
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-late-2', pg_temp.tok('h5'), '1 min')$$);
SELECT status, token = pg_temp.tok('h5') AS same_token, attempts, lease_expired,
       next_attempt_at IS NOT NULL AS due, lease_until IS NULL AS no_lease
  FROM idempotency.idem_get('hb-late-2');
-- The late holder may still complete (its work is recorded) until someone
-- claims the key again.
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('hb-late-2', pg_temp.tok('h5'), '"saved"'));
SELECT outcome FROM idempotency.idem_claim('hb-late-2');
-- Someone claimed since: IK001.
SELECT * FROM pg_temp.show('h8', idempotency.idem_claim('hb-late-4'));
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('hb-late-4', pg_temp.tok('h7'))$$);

-- ---------------------------------------------------------------- release
-- A key that this claim created disappears.
SELECT * FROM pg_temp.show('r1', idempotency.idem_claim('rel-1'));
SELECT idempotency.idem_release('rel-1', pg_temp.tok('r1'));
SELECT idempotency.idem_get('rel-1') IS NULL AS removed;
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-1', pg_temp.tok('r1'))$$);
SELECT * FROM pg_temp.show('r2', idempotency.idem_claim('rel-1'));
-- A registered key goes back to RECEIVED with the attempt given back.
SELECT outcome FROM idempotency.idem_register('rel-2', '{"q": 1}', 'job-42');
SELECT * FROM pg_temp.show('r3', idempotency.idem_claim('rel-2'));
SELECT idempotency.idem_release('rel-2', pg_temp.tok('r3'));
SELECT status, token, attempts, lease_until, job_ref, fingerprint IS NOT NULL AS has_fingerprint,
       expires_at FROM idempotency.idem_get('rel-2');
SELECT * FROM pg_temp.show(NULL, idempotency.idem_register('rel-2', '{"q": 1}'));
-- The released token is no longer current: IK001 for every holder call.
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-2', pg_temp.tok('r3'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('rel-2', pg_temp.tok('r3'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_fail('rel-2', pg_temp.tok('r3'), 'x')$$);
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('rel-2', pg_temp.tok('r3'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_assert_owner('rel-2', pg_temp.tok('r3'))$$);
SELECT * FROM pg_temp.show('r4', idempotency.idem_claim('rel-2', '{"q": 1}'));
-- A key that was not registered is removed by a release, even with earlier
-- failed attempts: the next claim starts again at attempt 1.
SELECT * FROM pg_temp.show('r5', idempotency.idem_claim('rel-3'));
SELECT idempotency.idem_fail('rel-3', pg_temp.tok('r5'), 'first try failed', retry_in => '0');
SELECT * FROM pg_temp.show('r6', idempotency.idem_claim('rel-3'));
SELECT idempotency.idem_release('rel-3', pg_temp.tok('r6'));
SELECT status, token, attempts, last_error, next_attempt_at <= clock_timestamp() AS claimable_now
  FROM idempotency.idem_get('rel-3');
SELECT * FROM pg_temp.show('r7', idempotency.idem_claim('rel-3'));
-- Release is refused once the holder finished the key (IK003), for a
-- stale token (IK001) and for an unknown key (IK002).
SELECT * FROM pg_temp.show(NULL, idempotency.idem_complete('rel-3', pg_temp.tok('r7')));
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-3', pg_temp.tok('r7'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-3', pg_temp.tok('r6'))$$);
SELECT idempotency.idem_fail('rel-2', pg_temp.tok('r4'), 'bad', retryable => false);
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-2', pg_temp.tok('r4'))$$);
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-missing', 1)$$);
-- A release after an expiry was recorded is refused (IK003): FAILED_FINAL
-- never goes back, and the key keeps its retention.
SET idempotency.max_attempts = 1;
SELECT outcome FROM idempotency.idem_register('rel-4');
SELECT * FROM pg_temp.show('r8', idempotency.idem_claim('rel-4', lease => '0.1s'));
RESET idempotency.max_attempts;
SELECT pg_sleep(0.15);
SELECT * FROM pg_temp.show(NULL, idempotency.idem_claim('rel-4'));
SELECT status, expires_at IS NOT NULL AS retained FROM idempotency.idem_get('rel-4');
SELECT pg_temp.try($$SELECT idempotency.idem_release('rel-4', pg_temp.tok('r8'))$$);
SELECT status, attempts, token = pg_temp.tok('r8') AS same_token, expires_at IS NOT NULL AS retained
  FROM idempotency.idem_get('rel-4');
