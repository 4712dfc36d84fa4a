-- Validation of every argument of every function: NULL (22004), empty and
-- out-of-range intervals (22023), too long or too large (22001), limits in
-- bytes, max_value_bytes, wrong tokens and unknown keys.
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

-- Here try() also shortens runs of ten or more equal characters in messages
-- (the long names the limits are tested with).
CREATE OR REPLACE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g'),
                                              '(.)\1{9,}', '\1\1\1...', 'g');
END $f$;

-- The key the holder functions are called on.
SELECT * FROM pg_temp.show('v', idempotency.idem_claim('val-key', lease => '1 hour'));

-- Each call runs alone; 'ok' means it was accepted. Names may be 255 bytes,
-- scopes 63; intervals must be positive (lease, extend, ttl, wait) and at most
-- idempotency.max_lease (1 day), or between 0 and 100 years (retain, retry_in).
-- idem_register
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_register(NULL, NULL, NULL, 'val.reg')$c$),
    (2, $c$idempotency.idem_register('', NULL, NULL, 'val.reg')$c$),
    (3, $c$idempotency.idem_register(repeat('x', 255), NULL, NULL, 'val.reg')$c$),
    (4, $c$idempotency.idem_register(repeat('x', 256), NULL, NULL, 'val.reg')$c$),
    (5, $c$idempotency.idem_register('val-r1', NULL, NULL, NULL)$c$),
    (6, $c$idempotency.idem_register('val-r1', NULL, NULL, '')$c$),
    (7, $c$idempotency.idem_register('val-r1', NULL, NULL, repeat('x', 63))$c$),
    (8, $c$idempotency.idem_register('val-r1', NULL, NULL, repeat('x', 64))$c$),
    (9, $c$idempotency.idem_register('val-r2', NULL, repeat('j', 255), 'val.reg')$c$),
    (10, $c$idempotency.idem_register('val-r3', NULL, repeat('j', 256), 'val.reg')$c$),
    (11, $c$idempotency.idem_register('val-r4', NULL, '', 'val.reg')$c$),
    (12, $c$idempotency.idem_register('val-r5', NULL, NULL, 'val.reg')$c$)
) v(n, call) ORDER BY n;
-- idem_claim
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_claim(NULL, scope => 'val.claim')$c$),
    (2, $c$idempotency.idem_claim('', scope => 'val.claim')$c$),
    (3, $c$idempotency.idem_claim(repeat('x', 255), scope => 'val.claim')$c$),
    (4, $c$idempotency.idem_claim(repeat('x', 256), scope => 'val.claim')$c$),
    (5, $c$idempotency.idem_claim('val-c1', scope => NULL)$c$),
    (6, $c$idempotency.idem_claim('val-c1', scope => '')$c$),
    (7, $c$idempotency.idem_claim('val-c1', scope => repeat('x', 63))$c$),
    (8, $c$idempotency.idem_claim('val-c1', scope => repeat('x', 64))$c$),
    (9, $c$idempotency.idem_claim('val-lease-0', lease => '0', scope => 'val.claim')$c$),
    (10, $c$idempotency.idem_claim('val-lease-1', lease => '-1s', scope => 'val.claim')$c$),
    (11, $c$idempotency.idem_claim('val-lease-2', lease => '-1 day', scope => 'val.claim')$c$),
    (12, $c$idempotency.idem_claim('val-lease-3', lease => '1 microsecond', scope => 'val.claim')$c$),
    (13, $c$idempotency.idem_claim('val-lease-4', lease => '1 day', scope => 'val.claim')$c$),
    (14, $c$idempotency.idem_claim('val-lease-5', lease => '24:00:00.000001', scope => 'val.claim')$c$),
    (15, $c$idempotency.idem_claim('val-lease-6', lease => '1 mon', scope => 'val.claim')$c$),
    (16, $c$idempotency.idem_claim('val-lease-7', lease => '1 year', scope => 'val.claim')$c$),
    (17, $c$idempotency.idem_claim('val-lease-8', lease => '2147483647 days', scope => 'val.claim')$c$),
    (18, $c$idempotency.idem_claim('val-lease-9', lease => '-2147483648 mons', scope => 'val.claim')$c$),
    (19, $c$idempotency.idem_claim('val-wait-0', wait => '0', scope => 'val.claim')$c$),
    (20, $c$idempotency.idem_claim('val-wait-1', wait => '-1s', scope => 'val.claim')$c$),
    (21, $c$idempotency.idem_claim('val-wait-2', wait => '1 day 1 second', scope => 'val.claim')$c$),
    (22, $c$idempotency.idem_claim('val-wait-3', wait => '2147483647 days', scope => 'val.claim')$c$),
    (23, $c$idempotency.idem_claim('val-wait-4', wait => '1 day', scope => 'val.claim')$c$),
    (24, $c$idempotency.idem_claim('val-wait-5', wait => '1 microsecond', scope => 'val.claim')$c$)
) v(n, call) ORDER BY n;
-- idem_complete
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_complete(NULL, 1)$c$),
    (2, $c$idempotency.idem_complete('', 1)$c$),
    (3, $c$idempotency.idem_complete(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_complete(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_complete('val-key', NULL)$c$),
    (6, $c$idempotency.idem_complete('val-key', 1, NULL, NULL)$c$),
    (7, $c$idempotency.idem_complete('val-key', 1, NULL, '')$c$),
    (8, $c$idempotency.idem_complete('val-key', 1, NULL, repeat('x', 63))$c$),
    (9, $c$idempotency.idem_complete('val-key', 1, NULL, repeat('x', 64))$c$),
    (10, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), retain => '-1 microsecond')$c$),
    (11, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), retain => '100 years 1 day')$c$),
    (12, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), retain => '1201 mons')$c$),
    (13, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), retain => '2147483647 days')$c$),
    (14, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), retain => '-2147483648 mons')$c$)
) v(n, call) ORDER BY n;
-- idem_fail
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_fail(NULL, 1, 'e')$c$),
    (2, $c$idempotency.idem_fail('', 1, 'e')$c$),
    (3, $c$idempotency.idem_fail(repeat('x', 255), 1, 'e')$c$),
    (4, $c$idempotency.idem_fail(repeat('x', 256), 1, 'e')$c$),
    (5, $c$idempotency.idem_fail('val-key', NULL, 'e')$c$),
    (6, $c$idempotency.idem_fail('val-key', pg_temp.tok('v'), NULL)$c$),
    (7, $c$idempotency.idem_fail('val-key', 1, 'e', scope => NULL)$c$),
    (8, $c$idempotency.idem_fail('val-key', 1, 'e', scope => '')$c$),
    (9, $c$idempotency.idem_fail('val-key', 1, 'e', scope => repeat('x', 63))$c$),
    (10, $c$idempotency.idem_fail('val-key', 1, 'e', scope => repeat('x', 64))$c$),
    (11, $c$idempotency.idem_fail('val-key', pg_temp.tok('v'), 'e', retry_in => '-1 microsecond')$c$),
    (12, $c$idempotency.idem_fail('val-key', pg_temp.tok('v'), 'e', retry_in => '100 years 1 day')$c$),
    (13, $c$idempotency.idem_fail('val-key', pg_temp.tok('v'), 'e', retry_in => '1201 mons')$c$),
    (14, $c$idempotency.idem_fail('val-key', pg_temp.tok('v'), 'e', retry_in => '2147483647 days')$c$)
) v(n, call) ORDER BY n;
-- idem_heartbeat
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_heartbeat(NULL, 1)$c$),
    (2, $c$idempotency.idem_heartbeat('', 1)$c$),
    (3, $c$idempotency.idem_heartbeat(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_heartbeat(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_heartbeat('val-key', NULL)$c$),
    (6, $c$idempotency.idem_heartbeat('val-key', 1, NULL, NULL)$c$),
    (7, $c$idempotency.idem_heartbeat('val-key', 1, NULL, '')$c$),
    (8, $c$idempotency.idem_heartbeat('val-key', 1, NULL, repeat('x', 63))$c$),
    (9, $c$idempotency.idem_heartbeat('val-key', 1, NULL, repeat('x', 64))$c$),
    (10, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'), '0')$c$),
    (11, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'), '-1s')$c$),
    (12, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'), '1 day 1 second')$c$),
    (13, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'), '2147483647 days')$c$)
) v(n, call) ORDER BY n;
-- idem_release
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_release(NULL, 1)$c$),
    (2, $c$idempotency.idem_release('', 1)$c$),
    (3, $c$idempotency.idem_release(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_release(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_release('val-key', NULL)$c$),
    (6, $c$idempotency.idem_release('val-key', 1, NULL)$c$),
    (7, $c$idempotency.idem_release('val-key', 1, '')$c$),
    (8, $c$idempotency.idem_release('val-key', 1, repeat('x', 63))$c$),
    (9, $c$idempotency.idem_release('val-key', 1, repeat('x', 64))$c$)
) v(n, call) ORDER BY n;
-- idem_get
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_get(NULL)$c$),
    (2, $c$idempotency.idem_get('')$c$),
    (3, $c$idempotency.idem_get(repeat('x', 255))$c$),
    (4, $c$idempotency.idem_get(repeat('x', 256))$c$),
    (5, $c$idempotency.idem_get('val-key', NULL)$c$),
    (6, $c$idempotency.idem_get('val-key', '')$c$),
    (7, $c$idempotency.idem_get('val-key', repeat('x', 63))$c$),
    (8, $c$idempotency.idem_get('val-key', repeat('x', 64))$c$)
) v(n, call) ORDER BY n;
-- idem_assert_owner
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_assert_owner(NULL, 1)$c$),
    (2, $c$idempotency.idem_assert_owner('', 1)$c$),
    (3, $c$idempotency.idem_assert_owner(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_assert_owner(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_assert_owner('val-key', NULL)$c$),
    (6, $c$idempotency.idem_assert_owner('val-key', 1, NULL)$c$),
    (7, $c$idempotency.idem_assert_owner('val-key', 1, '')$c$),
    (8, $c$idempotency.idem_assert_owner('val-key', 1, repeat('x', 63))$c$),
    (9, $c$idempotency.idem_assert_owner('val-key', 1, repeat('x', 64))$c$)
) v(n, call) ORDER BY n;
-- inbox_receive
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.inbox_receive(NULL, 'val.inbox')$c$),
    (2, $c$idempotency.inbox_receive('', 'val.inbox')$c$),
    (3, $c$idempotency.inbox_receive(repeat('x', 255), 'val.inbox')$c$),
    (4, $c$idempotency.inbox_receive(repeat('x', 256), 'val.inbox')$c$),
    (5, $c$idempotency.inbox_receive('val-m1', NULL)$c$),
    (6, $c$idempotency.inbox_receive('val-m1', '')$c$),
    (7, $c$idempotency.inbox_receive('val-m1', repeat('x', 255))$c$),
    (8, $c$idempotency.inbox_receive('val-m1', repeat('x', 256))$c$),
    (9, $c$idempotency.inbox_receive('val-m2', 'val.inbox', NULL)$c$)
) v(n, call) ORDER BY n;
-- idem_lock
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_lock(NULL)$c$),
    (2, $c$idempotency.idem_lock('')$c$),
    (3, $c$idempotency.idem_lock(repeat('x', 255))$c$),
    (4, $c$idempotency.idem_lock(repeat('x', 256))$c$),
    (5, $c$idempotency.idem_lock('val-lock-ttl-0', '0')$c$),
    (6, $c$idempotency.idem_lock('val-lock-ttl-1', '-1s')$c$),
    (7, $c$idempotency.idem_lock('val-lock-ttl-2', '1 day 1 second')$c$),
    (8, $c$idempotency.idem_lock('val-lock-ttl-3', '2147483647 days')$c$),
    (9, $c$idempotency.idem_lock('val-lock-ttl-4', '1 day')$c$),
    (10, $c$idempotency.idem_lock('val-lock-o1', owner => repeat('o', 255))$c$),
    (11, $c$idempotency.idem_lock('val-lock-o2', owner => repeat('o', 256))$c$),
    (12, $c$idempotency.idem_lock('val-lock-o3', owner => '')$c$),
    (13, $c$idempotency.idem_lock('val-lock-wait-0', wait => '0')$c$),
    (14, $c$idempotency.idem_lock('val-lock-wait-1', wait => '-1s')$c$),
    (15, $c$idempotency.idem_lock('val-lock-wait-2', wait => '1 day 1 second')$c$),
    (16, $c$idempotency.idem_lock('val-lock-wait-3', wait => '1 day')$c$)
) v(n, call) ORDER BY n;
-- idem_lock_renew
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_lock_renew(NULL, 1)$c$),
    (2, $c$idempotency.idem_lock_renew('', 1)$c$),
    (3, $c$idempotency.idem_lock_renew(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_lock_renew(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_lock_renew('val-lock-o1', NULL)$c$),
    (6, $c$idempotency.idem_lock_renew('val-lock-o1', 1, '0')$c$),
    (7, $c$idempotency.idem_lock_renew('val-lock-o1', 1, '-1s')$c$),
    (8, $c$idempotency.idem_lock_renew('val-lock-o1', 1, '1 day 1 second')$c$)
) v(n, call) ORDER BY n;
-- idem_unlock
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_unlock(NULL, 1)$c$),
    (2, $c$idempotency.idem_unlock('', 1)$c$),
    (3, $c$idempotency.idem_unlock(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_unlock(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_unlock('val-lock-o1', NULL)$c$)
) v(n, call) ORDER BY n;
-- idem_lock_assert
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_lock_assert(NULL, 1)$c$),
    (2, $c$idempotency.idem_lock_assert('', 1)$c$),
    (3, $c$idempotency.idem_lock_assert(repeat('x', 255), 1)$c$),
    (4, $c$idempotency.idem_lock_assert(repeat('x', 256), 1)$c$),
    (5, $c$idempotency.idem_lock_assert('val-lock-o1', NULL)$c$)
) v(n, call) ORDER BY n;
-- None of the refused calls changed the key.
SELECT status, token = pg_temp.tok('v') AS token_is_v, attempts, result, last_error,
       lease_until > clock_timestamp() + interval '50 min' AS lease_unchanged
  FROM idempotency.idem_get('val-key');

-- ---------------------------------------------------------------- wrong tokens, unknown keys
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_complete('val-key', pg_temp.tok('v') + 1)$c$),
    (2, $c$idempotency.idem_fail('val-key', pg_temp.tok('v') - 1, 'e')$c$),
    (3, $c$idempotency.idem_heartbeat('val-key', 0)$c$),
    (4, $c$idempotency.idem_release('val-key', -1)$c$),
    (5, $c$idempotency.idem_assert_owner('val-key', 9223372036854775807)$c$),
    (6, $c$idempotency.idem_complete('val-nokey', 1)$c$),
    (7, $c$idempotency.idem_fail('val-nokey', 1, 'e')$c$),
    (8, $c$idempotency.idem_heartbeat('val-nokey', 1)$c$),
    (9, $c$idempotency.idem_release('val-nokey', 1)$c$),
    (10, $c$idempotency.idem_assert_owner('val-nokey', 1)$c$),
    (11, $c$idempotency.idem_complete('val-key', pg_temp.tok('v'), scope => 'val.other')$c$),
    (12, $c$idempotency.idem_lock_assert('val-nolock', 1)$c$),
    (13, $c$idempotency.idem_lock_assert('val-lock-o1', 1)$c$)
) v(n, call) ORDER BY n;
SELECT idempotency.idem_lock_renew('val-nolock', 1) AS renewed, idempotency.idem_unlock('val-nolock', 1) AS unlocked;
SELECT idempotency.idem_lock_renew('val-lock-o1', 1) AS renewed, idempotency.idem_unlock('val-lock-o1', 1) AS unlocked;
SELECT idempotency.idem_get('val-nokey') IS NULL AS get_of_unknown_key_is_null;

-- ---------------------------------------------------------------- max_value_bytes
-- result, payload and error are limited by idempotency.max_value_bytes (a
-- superuser setting; units accepted).
SET idempotency.max_value_bytes = '1kB';
SHOW idempotency.max_value_bytes;
SELECT * FROM pg_temp.show('mv1', idempotency.idem_claim('val-big-1'));
SELECT * FROM pg_temp.show('mv2', idempotency.idem_claim('val-big-2'));
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_complete('val-big-1', pg_temp.tok('mv1'), to_jsonb(repeat('r', 2000)))$c$),
    (2, $c$idempotency.idem_complete('val-big-1', pg_temp.tok('mv1'), jsonb_build_object('rows', (SELECT jsonb_agg(g) FROM generate_series(1, 300) g)))$c$),
    (3, $c$idempotency.idem_fail('val-big-2', pg_temp.tok('mv2'), repeat('e', 1025))$c$),
    (4, $c$idempotency.inbox_receive('val-big-m1', 'val.inbox', to_jsonb(repeat('p', 2000)))$c$),
    (5, $c$idempotency.idem_fail('val-big-2', pg_temp.tok('mv2'), repeat('e', 1024), retry_in => '1 hour')$c$),
    (6, $c$idempotency.idem_complete('val-big-1', pg_temp.tok('mv1'), to_jsonb(repeat('r', 500)))$c$),
    (7, $c$idempotency.inbox_receive('val-big-m2', 'val.inbox', to_jsonb(repeat('p', 500)))$c$)
) v(n, call) ORDER BY n;
SELECT status, length(last_error) AS error_bytes FROM idempotency.idem_get('val-big-2');
SELECT status, length(result #>> '{}') AS result_chars FROM idempotency.idem_get('val-big-1');
RESET idempotency.max_value_bytes;
-- The default (1MB) lets those values through.
SELECT * FROM pg_temp.show('mv3', idempotency.idem_claim('val-big-3'));
SELECT outcome, length(result #>> '{}') AS result_chars
  FROM idempotency.idem_complete('val-big-3', pg_temp.tok('mv3'), to_jsonb(repeat('r', 100000)));
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('val-big-m3', 'val.inbox', to_jsonb(repeat('p', 2000000)))$$);

-- ---------------------------------------------------------------- max_lease
-- Every lease-like interval is checked against idempotency.max_lease, and
-- so is the default lease that stands in for a NULL one.
SET idempotency.max_lease = '1 min';
SET idempotency.default_lease = '2 min';
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_claim('val-ml-1')$c$),
    (2, $c$idempotency.idem_claim('val-ml-2', lease => '1 min 1 second')$c$),
    (3, $c$idempotency.idem_claim('val-ml-3', lease => '1 min', wait => '61s')$c$),
    (4, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'))$c$),
    (5, $c$idempotency.idem_lock('val-ml-lock')$c$),
    (6, $c$idempotency.idem_lock_renew('val-ml-lock', 1)$c$),
    (7, $c$idempotency.idem_claim('val-ml-4', lease => '1 min')$c$),
    (8, $c$idempotency.idem_heartbeat('val-key', pg_temp.tok('v'), '59s')$c$),
    (9, $c$idempotency.idem_lock('val-ml-lock', '1 min', wait => '1 min')$c$)
) v(n, call) ORDER BY n;
RESET idempotency.default_lease;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('val-ml-5')$$);
RESET idempotency.max_lease;

-- ---------------------------------------------------------------- bytes, not characters
-- In a UTF8 database: 127 two-byte characters plus one ASCII byte are 255
-- bytes (accepted); 128 two-byte characters are 256 bytes (refused).
CREATE DATABASE idem_utf8 TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C';
\c idem_utf8
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $f$;
CREATE TEMP TABLE s AS
SELECT repeat(chr(233), 127) || 'a' AS k255, repeat(chr(233), 128) AS k256,
       repeat(chr(233), 31) || 'a' AS s63, repeat(chr(233), 32) AS s64,
       repeat(chr(8364), 85) AS k255_3byte, repeat(chr(128512), 64) AS k256_4byte,
       repeat(chr(233), 512) AS e1024, repeat(chr(233), 512) || 'a' AS e1025;
SELECT char_length(k255) AS chars, octet_length(k255) AS bytes FROM s
UNION ALL SELECT char_length(k256), octet_length(k256) FROM s
UNION ALL SELECT char_length(s63), octet_length(s63) FROM s
UNION ALL SELECT char_length(s64), octet_length(s64) FROM s
UNION ALL SELECT char_length(k255_3byte), octet_length(k255_3byte) FROM s
UNION ALL SELECT char_length(k256_4byte), octet_length(k256_4byte) FROM s
UNION ALL SELECT char_length(e1025), octet_length(e1025) FROM s;
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.idem_register((SELECT k255 FROM s))$c$),
    (2, $c$idempotency.idem_register((SELECT k256 FROM s))$c$),
    (3, $c$idempotency.idem_claim((SELECT k255_3byte FROM s))$c$),
    (4, $c$idempotency.idem_claim((SELECT k256_4byte FROM s))$c$),
    (5, $c$idempotency.idem_claim('mb-1', scope => (SELECT s63 FROM s))$c$),
    (6, $c$idempotency.idem_claim('mb-2', scope => (SELECT s64 FROM s))$c$),
    (7, $c$idempotency.idem_register('mb-3', NULL, (SELECT k255 FROM s))$c$),
    (8, $c$idempotency.idem_register('mb-4', NULL, (SELECT k256 FROM s))$c$),
    (9, $c$idempotency.inbox_receive((SELECT k255 FROM s), (SELECT k255_3byte FROM s))$c$),
    (10, $c$idempotency.inbox_receive((SELECT k256 FROM s))$c$),
    (11, $c$idempotency.inbox_receive('mb-5', (SELECT k256_4byte FROM s))$c$),
    (12, $c$idempotency.idem_lock((SELECT k255 FROM s), owner => (SELECT k255_3byte FROM s))$c$),
    (13, $c$idempotency.idem_lock((SELECT k256 FROM s))$c$),
    (14, $c$idempotency.idem_lock('mb-6', owner => (SELECT k256 FROM s))$c$)
) v(n, call) ORDER BY n;
-- max_value_bytes counts bytes too.
SET idempotency.max_value_bytes = 1024;
SELECT token AS mb_token FROM idempotency.idem_claim('mb-err') \gset
SELECT pg_temp.try(format('SELECT idempotency.idem_fail(%L, %s, (SELECT e1025 FROM s))', 'mb-err', :mb_token));
SELECT pg_temp.try(format('SELECT idempotency.idem_fail(%L, %s, (SELECT e1024 FROM s))', 'mb-err', :mb_token));
SELECT char_length(last_error) AS chars, octet_length(last_error) AS bytes FROM idempotency.idem_get('mb-err');
RESET idempotency.max_value_bytes;
-- The stored keys are what was given.
SELECT octet_length(key) AS key_bytes, octet_length(scope) AS scope_bytes, status
  FROM idempotency.idempotency_keys ORDER BY 1, 2;
\c contrib_regression
DROP DATABASE idem_utf8;
