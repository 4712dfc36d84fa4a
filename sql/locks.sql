-- Resource locks: idem_lock, idem_lock_renew, idem_unlock, idem_lock_assert.
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
CREATE TEMP TABLE lock_tokens (label text PRIMARY KEY, token bigint);

-- A free resource: a fencing token. Held: NULL (no waiting by default).
INSERT INTO lock_tokens SELECT 'k1', token FROM idempotency.idem_claim('lock-baseline');
INSERT INTO lock_tokens SELECT 'l1', idempotency.idem_lock('res-1', '1 min', 'worker-a');
SELECT token IS NOT NULL AS got_it, token > (SELECT token FROM lock_tokens WHERE label = 'k1') AS after_key_token
  FROM lock_tokens WHERE label = 'l1';
SELECT idempotency.idem_lock('res-1') IS NULL AS held_elsewhere;
SELECT idempotency.idem_lock('res-1', '1 min', 'worker-b') IS NULL AS held_elsewhere;
-- The holder's token passes the assert, renews and releases; others do not.
SELECT idempotency.idem_lock_assert('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1'));
SELECT pg_temp.try($$SELECT idempotency.idem_lock_assert('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1') + 1)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_lock_assert('res-unknown', 1)$$);
SELECT idempotency.idem_lock_renew('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1'), '2 min') AS renewed;
SELECT idempotency.idem_lock_renew('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1') + 1) AS renewed;
SELECT idempotency.idem_lock_renew('res-unknown', 1) AS renewed;
SELECT owner, expires_at > clock_timestamp() + interval '110s' AS renewed_ttl
  FROM idempotency.locks WHERE resource = 'res-1';
SELECT idempotency.idem_unlock('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1') + 1) AS unlocked;
SELECT idempotency.idem_unlock('res-unknown', 1) AS unlocked;
SELECT idempotency.idem_unlock('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1')) AS unlocked;
SELECT idempotency.idem_unlock('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1')) AS unlocked_again;
-- Once released the old token holds nothing.
SELECT pg_temp.try($$SELECT idempotency.idem_lock_assert('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1'))$$);
SELECT idempotency.idem_lock_renew('res-1', (SELECT token FROM lock_tokens WHERE label = 'l1')) AS renewed;
-- Taken again: a new, larger token (tokens only grow).
INSERT INTO lock_tokens SELECT 'l2', idempotency.idem_lock('res-1');
SELECT (SELECT token FROM lock_tokens WHERE label = 'l2') > (SELECT token FROM lock_tokens WHERE label = 'l1') AS grows;
-- ttl defaults to idempotency.default_lease; owner is optional.
SELECT owner, expires_at - acquired_at AS ttl FROM idempotency.locks WHERE resource = 'res-1';
SET idempotency.default_lease = '7s';
SELECT idempotency.idem_lock('res-2') IS NOT NULL AS got_it;
RESET idempotency.default_lease;
SELECT owner, expires_at - acquired_at AS ttl FROM idempotency.locks WHERE resource = 'res-2';
SELECT idempotency.idem_lock('res-3', owner => '') IS NOT NULL AS got_it;
SELECT owner = '' AS empty_owner FROM idempotency.locks WHERE resource = 'res-3';

-- Expiry: an expired lock is free to take; the old token is fenced off.
INSERT INTO lock_tokens SELECT 'e1', idempotency.idem_lock('res-exp', '0.4s', 'slow worker');
INSERT INTO lock_tokens SELECT 'e2', idempotency.idem_lock('res-exp-2', '0.4s');
INSERT INTO lock_tokens SELECT 'r1', idempotency.idem_lock('res-renewed', '0.4s');
SELECT idempotency.idem_lock_renew('res-renewed', (SELECT token FROM lock_tokens WHERE label = 'r1'), '1 min') AS renewed;
SELECT idempotency.idem_lock('res-exp') IS NULL AS still_held;
SELECT pg_sleep(0.5);
-- Not taken by anyone yet, but expired: the old holder can neither assert nor renew.
SELECT pg_temp.try($$SELECT idempotency.idem_lock_assert('res-exp-2', (SELECT token FROM lock_tokens WHERE label = 'e2'))$$);
SELECT idempotency.idem_lock_renew('res-exp-2', (SELECT token FROM lock_tokens WHERE label = 'e2')) AS renewed;
-- Taken over.
INSERT INTO lock_tokens SELECT 'e3', idempotency.idem_lock('res-exp', '1 min', 'fast worker');
SELECT token IS NOT NULL AS got_it, token > (SELECT max(token) FROM lock_tokens WHERE label <> 'e3') AS grows
  FROM lock_tokens WHERE label = 'e3';
SELECT owner FROM idempotency.locks WHERE resource = 'res-exp';
SELECT pg_temp.try($$SELECT idempotency.idem_lock_assert('res-exp', (SELECT token FROM lock_tokens WHERE label = 'e1'))$$);
SELECT idempotency.idem_lock_renew('res-exp', (SELECT token FROM lock_tokens WHERE label = 'e1')) AS renewed;
SELECT idempotency.idem_unlock('res-exp', (SELECT token FROM lock_tokens WHERE label = 'e1')) AS unlocked;
SELECT idempotency.idem_lock_assert('res-exp', (SELECT token FROM lock_tokens WHERE label = 'e3'));
-- The renewed lock outlived its first ttl.
SELECT idempotency.idem_lock_assert('res-renewed', (SELECT token FROM lock_tokens WHERE label = 'r1'));
SELECT idempotency.idem_lock('res-renewed') IS NULL AS still_held;

-- wait: waits for the holder's lock to expire (or be released) ...
SELECT idempotency.idem_lock('res-wait', '0.3s') IS NOT NULL AS got_it;
SELECT expires_at AS held_until, clock_timestamp() AS wait_start FROM idempotency.locks WHERE resource = 'res-wait' \gset
SELECT idempotency.idem_lock('res-wait', '1 min', wait => '3s') IS NOT NULL AS got_it_after_waiting;
SELECT clock_timestamp() >= :'held_until'::timestamptz AS waited_for_the_ttl,
       clock_timestamp() - :'wait_start'::timestamptz < '3s' AS not_until_the_end;
-- ... and gives up with NULL when wait runs out.
SELECT clock_timestamp() AS wait_start \gset
SELECT idempotency.idem_lock('res-wait', '1 min', wait => '0.2s') IS NULL AS gave_up;
SELECT clock_timestamp() - :'wait_start'::timestamptz >= '0.2s' AS waited_all;

-- A lock taken in a transaction that rolls back was never taken.
BEGIN;
SELECT idempotency.idem_lock('res-tx') IS NOT NULL AS got_it;
SELECT idempotency.idem_lock('res-tx') IS NULL AS held_by_my_transaction;
ROLLBACK;
SELECT idempotency.idem_lock('res-tx') IS NOT NULL AS got_it;
