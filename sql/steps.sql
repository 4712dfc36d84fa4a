-- Multi-step work: idem_step records the finished steps of a PROCESSING
-- key, fenced by its token as idem_complete is, in the caller's
-- transaction; a claim granted on a key with steps returns them (and
-- idem_get shows them); idem_step_key derives the key of a step's external
-- call. Every outcome and error of both, takeovers and retries that
-- resume, release and purge of a key with steps, and the limits.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- Only the leases given below end during the test, however slow the machine.
SET idempotency.default_lease = '1h';
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message' (tokens masked).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g');
END $f$;
-- Tokens by label: claim(label, key, ...) claims and keeps the token.
CREATE TEMP TABLE seen (label text PRIMARY KEY, token bigint NOT NULL);
CREATE FUNCTION pg_temp.tok(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT token FROM seen WHERE label = l $f$;
CREATE FUNCTION pg_temp.claim(l text, k text, lease interval DEFAULT NULL,
                              scope text DEFAULT 'default')
RETURNS TABLE (outcome text, status idempotency.idem_status, attempt int, steps jsonb)
LANGUAGE plpgsql AS $f$
DECLARE
    r idempotency.idem_outcome;
BEGIN
    r := idempotency.idem_claim(k, lease => lease, scope => scope);
    IF r.token IS NOT NULL THEN
        INSERT INTO seen VALUES (l, r.token) ON CONFLICT (label) DO UPDATE SET token = excluded.token;
    END IF;
    outcome := r.outcome; status := r.status; attempt := r.attempt; steps := r.steps;
    RETURN NEXT;
END $f$;
-- The steps of a key in their order: name, place, attempt, result.
CREATE FUNCTION pg_temp.steps(k text, scope text DEFAULT 'default')
RETURNS TABLE (step text, n int, attempt int, result jsonb)
LANGUAGE sql AS $f$
    SELECT s.key, (s.value->>'n')::int, (s.value->>'attempt')::int, s.value->'result'
      FROM idempotency.idem_get(k, scope) g, jsonb_each(g.steps) s
     ORDER BY (s.value->>'n')::int
$f$;
SELECT pg_stat_force_next_flush();

-- ---------------------------------------------------------------- recording steps

-- Each step gets the next place; its result is kept as given, a NULL
-- result as JSON null; the claim that recorded it is its attempt.
SELECT * FROM pg_temp.claim('a1', 'order-1');
SELECT idempotency.idem_step('order-1', pg_temp.tok('a1'), 'reserve', '{"sku": "B", "qty": 2}') AS n;
SELECT idempotency.idem_step('order-1', pg_temp.tok('a1'), 'charge', '"ch_981"') AS n;
SELECT idempotency.idem_step('order-1', pg_temp.tok('a1'), 'email') AS n;
SELECT idempotency.idem_step('order-1', pg_temp.tok('a1'), 'audit:1', '[1, 2.50, null]') AS n;
SELECT * FROM pg_temp.steps('order-1');
-- The steps are a column of the key's row; nothing else of the row changes.
SELECT status, attempts, updated_at = claimed_at AS state_unchanged, jsonb_typeof(steps) AS steps
  FROM idempotency.idem_get('order-1');
-- A step name is matched exactly: another case is another step.
SELECT idempotency.idem_step('order-1', pg_temp.tok('a1'), 'Charge', '"other"') AS n;
SELECT (idempotency.idem_complete('order-1', pg_temp.tok('a1'), '{"order": 1}')).outcome;
-- A duplicate of the finished work is answered without the steps.
SELECT * FROM pg_temp.claim('a1-dup', 'order-1');
SELECT count(*) AS steps_kept FROM pg_temp.steps('order-1');

-- The record is written in the caller's transaction: rolled back with it,
-- committed with the step's own writes.
CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL);
SELECT * FROM pg_temp.claim('t1', 'order-2');
BEGIN;
INSERT INTO stock VALUES ('B', 2);
SELECT idempotency.idem_step('order-2', pg_temp.tok('t1'), 'reserve', '{"reserved": 2}') AS n;
ROLLBACK;
SELECT count(*) AS steps, (SELECT count(*) FROM stock) AS stock_rows FROM pg_temp.steps('order-2');
BEGIN;
INSERT INTO stock VALUES ('B', 2);
SELECT idempotency.idem_step('order-2', pg_temp.tok('t1'), 'reserve', '{"reserved": 2}') AS n;
COMMIT;
SELECT step, n, (SELECT count(*) FROM stock) AS stock_rows FROM pg_temp.steps('order-2');
-- A step inside a subtransaction that rolls back is gone with it.
BEGIN;
SAVEPOINT s;
SELECT idempotency.idem_step('order-2', pg_temp.tok('t1'), 'charge', '"ch_1"') AS n;
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.idem_step('order-2', pg_temp.tok('t1'), 'charge', '"ch_2"') AS n;
COMMIT;
SELECT * FROM pg_temp.steps('order-2');

-- Recording a step is a HOT update of the key's row (no index follows the
-- steps): a job's steps, each in its own transaction.
SELECT * FROM pg_temp.claim('h1', 'order-hot');
SELECT pg_stat_force_next_flush();
SELECT pg_stat_get_tuples_updated('idempotency.idempotency_keys'::regclass) AS updated_before,
       pg_stat_get_tuples_hot_updated('idempotency.idempotency_keys'::regclass) AS hot_before \gset
SELECT format($$SELECT FROM idempotency.idem_step('order-hot', pg_temp.tok('h1'), 'step-%s')$$, i)
  FROM generate_series(1, 6) i \gexec
SELECT pg_stat_force_next_flush();
SELECT pg_stat_get_tuples_updated('idempotency.idempotency_keys'::regclass) - :updated_before AS updated,
       pg_stat_get_tuples_hot_updated('idempotency.idempotency_keys'::regclass) - :hot_before AS hot;

-- ---------------------------------------------------------------- refusals

-- A step of the same name again: IK004, whoever records it, and nothing changes.
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-2', %s, 'reserve', '{"reserved": 5}')$$,
                          pg_temp.tok('t1'))) AS duplicate;
SELECT result FROM pg_temp.steps('order-2') WHERE step = 'reserve';
-- A token the key never had, an older one, none: IK001; no such key: IK002.
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-2', %s, 'x')$$, pg_temp.tok('t1') + 1000)) AS stale;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-2', %s, 'x')$$, pg_temp.tok('a1'))) AS other_keys_token;
SELECT pg_temp.try($$SELECT idempotency.idem_step('no-such-key', 1, 'x')$$) AS missing;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-2', %s, 'x', scope => 'elsewhere')$$,
                          pg_temp.tok('t1'))) AS other_scope;
-- After the complete: IK003 (the work is done; never replayed as complete is).
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-1', %s, 'late')$$, pg_temp.tok('a1'))) AS after_complete;
-- After the holder's own failure, retryable or final: IK003.
SELECT * FROM pg_temp.claim('f1', 'order-3');
SELECT idempotency.idem_fail('order-3', pg_temp.tok('f1'), 'provider down', retry_in => '1 hour');
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-3', %s, 'x')$$, pg_temp.tok('f1'))) AS after_fail;
SELECT * FROM pg_temp.claim('f2', 'order-4');
SELECT idempotency.idem_fail('order-4', pg_temp.tok('f2'), 'card declined', false);
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-4', %s, 'x')$$, pg_temp.tok('f2'))) AS after_final;
-- A registered key nobody claimed has no token: IK001.
SELECT outcome FROM idempotency.idem_register('order-5');
SELECT pg_temp.try($$SELECT idempotency.idem_step('order-5', 1, 'x')$$) AS unclaimed;
-- The result's size: at most idempotency.max_step_bytes (checked with the
-- arguments, before the key is read).
SET idempotency.max_step_bytes = 20;
SELECT * FROM pg_temp.claim('z1', 'order-6');
-- (A jsonb string of n characters takes 8 + n bytes.)
SELECT idempotency.idem_step('order-6', pg_temp.tok('z1'), 'small', '"123456789012"') AS n;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-6', %s, 'big', '"1234567890123"')$$,
                          pg_temp.tok('z1'))) AS too_big;
SELECT pg_temp.try($$SELECT idempotency.idem_step('no-such-key', 1, 'big', '"1234567890123"')$$) AS too_big_first;
RESET idempotency.max_step_bytes;
-- The number of steps: at most idempotency.max_steps; the last one allowed
-- is recorded, the next refused (54000); a duplicate is still IK004.
SET idempotency.max_steps = 2;
SELECT idempotency.idem_step('order-6', pg_temp.tok('z1'), 'second') AS n;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-6', %s, 'third')$$, pg_temp.tok('z1'))) AS too_many;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-6', %s, 'small')$$, pg_temp.tok('z1'))) AS duplicate;
RESET idempotency.max_steps;
SELECT idempotency.idem_step('order-6', pg_temp.tok('z1'), 'third') AS n_once_allowed;
-- Only a superuser sets the limits.
CREATE ROLE regress_steps_user;
SET ROLE regress_steps_user;
SELECT pg_temp.try($$SET idempotency.max_steps = 1000$$) AS set_max_steps,
       pg_temp.try($$SET idempotency.max_step_bytes = '1GB'$$) AS set_max_step_bytes;
RESET ROLE;
-- (The SQL edition took them, for the session: set back.)
RESET idempotency.max_steps;
RESET idempotency.max_step_bytes;
DROP ROLE regress_steps_user;

-- Arguments: NULL, empty, too long and absurd names.
SELECT pg_temp.try($$SELECT idempotency.idem_step(NULL, 1, 'x')$$) AS null_key,
       pg_temp.try($$SELECT idempotency.idem_step('k', NULL, 'x')$$) AS null_token,
       pg_temp.try($$SELECT idempotency.idem_step('k', 1, NULL)$$) AS null_step,
       pg_temp.try($$SELECT idempotency.idem_step('k', 1, 'x', scope => NULL)$$) AS null_scope;
SELECT pg_temp.try($$SELECT idempotency.idem_step('', 1, 'x')$$) AS empty_key,
       pg_temp.try($$SELECT idempotency.idem_step('k', 1, '')$$) AS empty_step,
       pg_temp.try($$SELECT idempotency.idem_step('k', 1, 'x', scope => '')$$) AS empty_scope;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step(%L, 1, 'x')$$, repeat('k', 256))) AS long_key,
       pg_temp.try(format($$SELECT idempotency.idem_step('k', 1, %L)$$, repeat('s', 64))) AS long_step,
       pg_temp.try(format($$SELECT idempotency.idem_step('k', 1, %L)$$, repeat('s', 1000000))) AS huge_step;
-- 63 bytes is a name; the key is then checked (IK002).
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('k', 1, %L)$$, repeat('s', 63))) AS step_of_63;
SELECT name, pg_temp.try(format($$SELECT idempotency.idem_step('k', 1, %L)$$, name)) AS refused
  FROM unnest(ARRAY['charge card', 'a/b', E'tab\there', E'new\nline', 'café', '"quoted"', 'a=b',
                    ' ', 'x;DROP TABLE stock', '💳']) AS name;
-- The token: any bigint is only a token the key does not have.
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-6', %s, 'x')$$, t)) AS absurd_token
  FROM unnest(ARRAY[0, -1, 9223372036854775807, -9223372036854775808]::bigint[]) t;

-- ---------------------------------------------------------------- resuming

-- A takeover of an expired lease: the new holder gets the steps the old
-- one finished, with their results, and records the rest under its own
-- attempt; the old holder's token is stale. It is counted as a resumed
-- takeover.
SELECT resumed_takeovers AS resumed_before FROM idempotency.idem_metrics \gset
SELECT * FROM pg_temp.claim('r1', 'order-7', lease => '100ms');
SELECT idempotency.idem_step('order-7', pg_temp.tok('r1'), 'reserve', '{"reserved": 1}') AS n;
SELECT idempotency.idem_step('order-7', pg_temp.tok('r1'), 'charge', '"ch_7"') AS n;
SELECT pg_sleep(0.2);
SELECT outcome, status, attempt, steps->'charge'->'result' AS charge, steps->'reserve'->>'n' AS reserve_n,
       (SELECT count(*) FROM jsonb_object_keys(steps)) AS finished
  FROM pg_temp.claim('r2', 'order-7');
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-7', %s, 'email')$$, pg_temp.tok('r1'))) AS old_holder;
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-7', %s, 'charge', '"ch_again"')$$,
                          pg_temp.tok('r2'))) AS finished_step_again;
SELECT idempotency.idem_step('order-7', pg_temp.tok('r2'), 'email', '{"message": "m-7"}') AS n;
SELECT * FROM pg_temp.steps('order-7');
SELECT resumed_takeovers - :resumed_before AS resumed FROM idempotency.idem_metrics;
-- A takeover of a key without steps returns none and is not counted.
SELECT * FROM pg_temp.claim('r3', 'order-8', lease => '100ms');
SELECT pg_sleep(0.2);
SELECT * FROM pg_temp.claim('r4', 'order-8');
SELECT resumed_takeovers - :resumed_before AS resumed FROM idempotency.idem_metrics;
-- A holder whose lease expired (the sweep made the key FAILED_RETRYABLE)
-- keeps its token until the key is claimed again: its step still counts,
-- as its late complete would; the next claim resumes after it.
SELECT * FROM pg_temp.claim('e1', 'order-9', lease => '100ms');
SELECT pg_sleep(0.2);
-- (Keys other tests left may be due too: the key's own row says which.)
SELECT task, rows >= 1 AS expired FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT status, lease_expired FROM idempotency.idem_get('order-9');
SELECT idempotency.idem_step('order-9', pg_temp.tok('e1'), 'charge', '"ch_9"') AS late_step;
SELECT outcome, attempt, steps->'charge'->'result' AS charge FROM pg_temp.claim('e2', 'order-9');
SELECT pg_temp.try(format($$SELECT idempotency.idem_step('order-9', %s, 'email')$$, pg_temp.tok('e1'))) AS late_after_claim;
-- A retry after the holder's retryable failure resumes too.
SELECT * FROM pg_temp.claim('y1', 'order-10');
SELECT idempotency.idem_step('order-10', pg_temp.tok('y1'), 'reserve') AS n;
SELECT idempotency.idem_fail('order-10', pg_temp.tok('y1'), 'provider timeout', retry_in => '0');
SELECT outcome, attempt, steps ? 'reserve' AS has_reserve FROM pg_temp.claim('y2', 'order-10');
SELECT resumed_takeovers - :resumed_before AS resumed FROM idempotency.idem_metrics;
-- Other answers about a key with steps carry none: in progress, and
-- register's.
SELECT outcome, steps FROM idempotency.idem_claim('order-10');
SELECT outcome, steps FROM idempotency.idem_register('order-10');

-- A release gives the attempt back. A key with finished steps is kept with
-- them (back to RECEIVED, registered or not), so that the next claim
-- resumes; one without steps is removed as before.
SELECT idempotency.idem_release('order-10', pg_temp.tok('y2'));
SELECT status, attempts, token, registered, steps ? 'reserve' AS has_reserve FROM idempotency.idem_get('order-10');
SELECT outcome, attempt, steps ? 'reserve' AS has_reserve FROM pg_temp.claim('y3', 'order-10');
SELECT * FROM pg_temp.claim('w1', 'order-11');
SELECT idempotency.idem_release('order-11', pg_temp.tok('w1'));
SELECT idempotency.idem_get('order-11') IS NULL AS removed;

-- ---------------------------------------------------------------- purge

-- The steps go with the key: a purged key leaves a tombstone without them,
-- and a claim after its tombstone is forgotten starts from nothing.
SELECT * FROM pg_temp.claim('p1', 'order-12', scope => 'purged');
SELECT idempotency.idem_step('order-12', pg_temp.tok('p1'), 'charge', '"ch_12"', 'purged') AS n;
SELECT outcome FROM idempotency.idem_complete('order-12', pg_temp.tok('p1'), scope => 'purged', retain => '0');
-- A retention of 0 files the key for purging in the complete's own write,
-- so the sweep has nothing to settle (read from the row: a pass's count
-- would include keys other tests left whose leases run out meanwhile).
SELECT active_since IS NULL AND lease_until IS NULL AND purge_at IS NOT NULL AS filed
  FROM idempotency.idempotency_keys WHERE scope = 'purged' AND key = 'order-12';
SELECT task, rows >= 1 AS did_rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys';
SELECT status, result_expired, steps IS NULL AS no_steps
  FROM idempotency.idem_get('order-12', 'purged');
-- The tombstone's digest of (scope, key), as docs/keys.md writes it in SQL.
DELETE FROM idempotency.key_tombstones
 WHERE key_digest = encode(substr(sha256(convert_to('purged', 'UTF8') || '\x00'::bytea
                                        || convert_to('order-12', 'UTF8')), 1, 16), 'hex')::uuid;
SELECT * FROM pg_temp.claim('p2', 'order-12', scope => 'purged');

-- ---------------------------------------------------------------- idem_step_key

-- The key of a step's external call: the step's name and 32 hex digits,
-- the same at every call and attempt, another for another step, key or
-- scope. Its text is a contract with the providers that received it: the
-- value below must never change.
SELECT idempotency.idem_step_key('order-42', 'charge') AS charge_key,
       idempotency.idem_step_key('order-42', 'charge', 'payment.capture') AS in_scope;
SELECT idempotency.idem_step_key('order-7', 'charge') ~ '^charge-[0-9a-f]{32}$' AS well_formed,
       idempotency.idem_step_key('order-7', 'charge') = idempotency.idem_step_key('order-7', 'charge', 'default') AS stable;
SELECT count(DISTINCT idempotency.idem_step_key(k, s, sc)) AS distinct_keys, count(*) AS triples
  FROM (VALUES ('a', 'b', 'c'), ('a', 'b', 'd'), ('a', 'bb', 'c'), ('ab', 'b', 'c'),
               ('a:b', 'c', 'x'), ('a', 'c', 'b:x'), ('1:a', 'c', 'x'), ('1', 'c', 'a:x')) AS t(k, s, sc);
-- It reads no table and needs no claim: a key that does not exist has one.
SELECT length(idempotency.idem_step_key('never-claimed', 'x')) AS length;
SELECT pg_temp.try($$SELECT idempotency.idem_step_key(NULL, 'x')$$) AS null_key,
       pg_temp.try($$SELECT idempotency.idem_step_key('k', NULL)$$) AS null_step,
       pg_temp.try($$SELECT idempotency.idem_step_key('k', 'x', NULL)$$) AS null_scope;
SELECT pg_temp.try($$SELECT idempotency.idem_step_key('', 'x')$$) AS empty_key,
       pg_temp.try($$SELECT idempotency.idem_step_key('k', '')$$) AS empty_step,
       pg_temp.try(format($$SELECT idempotency.idem_step_key('k', %L)$$, repeat('s', 64))) AS long_step,
       pg_temp.try(format($$SELECT idempotency.idem_step_key('k', 'x', %L)$$, repeat('s', 64))) AS long_scope,
       pg_temp.try($$SELECT idempotency.idem_step_key('k', 'charge card')$$) AS bad_step;
-- The longest: 63 bytes of name, a dash and 32 digits.
SELECT length(idempotency.idem_step_key(repeat('k', 255), repeat('s', 63), repeat('c', 63))) AS longest;

DROP TABLE stock;
