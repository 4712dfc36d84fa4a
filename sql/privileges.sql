-- Privileges: an application role with only USAGE on schema idempotency
-- calls every application function (keys, inbox, locks, outbox) and touches
-- no table; administrative functions (idem_maintenance, outbox_redrive) and
-- the views are not for PUBLIC; pg_monitor members read the views.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g');
END $f$;
CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_monitor;
CREATE ROLE regress_idem_nobody;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_app;
GRANT pg_monitor TO regress_idem_monitor;
-- A scratch table the application role may write, for its tokens.
CREATE TEMP TABLE app_tokens (label text PRIMARY KEY, token bigint);
GRANT ALL ON app_tokens TO regress_idem_app;

-- What the extension grants: no function is SECURITY DEFINER or carries a
-- SET clause (the C code switches to the owner and pins the search path;
-- sql/search_path.sql proves the pin); PUBLIC may not run the administrative
-- ones.
SELECT p.proname, p.prosecdef AS security_definer, p.proconfig,
       coalesce((SELECT bool_or(a.grantee = 0 AND a.privilege_type = 'EXECUTE')
                   FROM aclexplode(p.proacl) a), true) AS public_may_execute,
       has_function_privilege('regress_idem_app', p.oid, 'EXECUTE') AS app_may_execute
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
 ORDER BY p.proname COLLATE "C";
SELECT c.relname, c.relkind,
       has_table_privilege('regress_idem_app', c.oid, 'SELECT') AS app_select,
       has_table_privilege('regress_idem_app', c.oid, 'INSERT') AS app_insert,
       has_table_privilege('regress_idem_app', c.oid, 'UPDATE') AS app_update,
       has_table_privilege('regress_idem_app', c.oid, 'DELETE') AS app_delete,
       has_table_privilege('regress_idem_monitor', c.oid, 'SELECT') AS monitor_select
  FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'v', 'S')
 ORDER BY c.relname COLLATE "C";

-- ---------------------------------------------------------------- the application role
SET ROLE regress_idem_app;
SELECT outcome, status FROM idempotency.idem_register('priv-1', '{"a": 1}', 'job-1');
INSERT INTO app_tokens SELECT 'k1', token FROM idempotency.idem_claim('priv-1', '{"a": 1}');
SELECT idempotency.idem_heartbeat('priv-1', (SELECT token FROM app_tokens WHERE label = 'k1'), '1 min') > now() AS heartbeat;
SELECT idempotency.idem_assert_owner('priv-1', (SELECT token FROM app_tokens WHERE label = 'k1'));
SELECT outcome, status, result FROM idempotency.idem_complete('priv-1', (SELECT token FROM app_tokens WHERE label = 'k1'), '{"ok": 1}');
SELECT status, job_ref, result FROM idempotency.idem_get('priv-1');
INSERT INTO app_tokens SELECT 'k2', token FROM idempotency.idem_claim('priv-2');
SELECT idempotency.idem_fail('priv-2', (SELECT token FROM app_tokens WHERE label = 'k2'), 'oops', retry_in => '0');
INSERT INTO app_tokens SELECT 'k3', token FROM idempotency.idem_claim('priv-2');
SELECT idempotency.idem_release('priv-2', (SELECT token FROM app_tokens WHERE label = 'k3'));
SELECT status, attempts FROM idempotency.idem_get('priv-2');
SELECT idempotency.inbox_receive('priv-m1', 'app') AS first_time, idempotency.inbox_receive('priv-m1', 'app') AS again;
INSERT INTO app_tokens SELECT 'l1', idempotency.idem_lock('priv-res', '1 min', 'app');
SELECT idempotency.idem_lock_renew('priv-res', (SELECT token FROM app_tokens WHERE label = 'l1')) AS renewed;
SELECT idempotency.idem_lock_assert('priv-res', (SELECT token FROM app_tokens WHERE label = 'l1'));
SELECT idempotency.idem_unlock('priv-res', (SELECT token FROM app_tokens WHERE label = 'l1')) AS unlocked;
INSERT INTO app_tokens SELECT 'k4', token FROM idempotency.idem_claim('priv-5', scope => 'priv');
SELECT outcome FROM idempotency.idem_complete('priv-5', (SELECT token FROM app_tokens WHERE label = 'k4'), scope => 'priv');
SELECT outcome FROM idempotency.idem_register('priv-6', scope => 'priv');
-- The outbox: enqueue (with dedup), claim, ack, nack.
INSERT INTO app_tokens SELECT 'o1', idempotency.outbox_enqueue('priv.events', '{"n": 1}', 'k1', '{"h": "v"}', 'priv-d1');
INSERT INTO app_tokens SELECT 'o2', idempotency.outbox_enqueue('priv.events', '{"n": 2}', 'k2');
SELECT idempotency.outbox_enqueue('priv.events', '{"n": 3}', dedup_key => 'priv-d1')
       = (SELECT token FROM app_tokens WHERE label = 'o1') AS deduplicated;
SELECT (SELECT a.label FROM app_tokens a WHERE a.token = c.id AND a.label LIKE 'o%') AS event,
       c.topic, c.key, c.payload, c.headers, c.dedup_key, c.attempt
  FROM idempotency.outbox_claim('priv-relay', topics => '{priv.events}') c ORDER BY c.id;
SELECT idempotency.outbox_ack(ARRAY[(SELECT token FROM app_tokens WHERE label = 'o1')]) AS acked;
SELECT idempotency.outbox_nack((SELECT token FROM app_tokens WHERE label = 'o2'), 'rejected', false) AS state;
-- Errors come through as for anybody.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('priv-2', 1)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('priv-missing', 1)$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_nack(-1, 'e')$$);
-- ... but no table, sequence, view or administrative function.
SELECT call, pg_temp.try(call) AS result FROM (VALUES
    (1, $c$SELECT * FROM idempotency.idempotency_keys$c$),
    (2, $c$INSERT INTO idempotency.idempotency_keys (scope, key, status, created_at, updated_at) VALUES ('default', 'forged', 'COMPLETED', now(), now())$c$),
    (3, $c$UPDATE idempotency.idempotency_keys SET status = 'COMPLETED'$c$),
    (4, $c$DELETE FROM idempotency.idempotency_keys$c$),
    (5, $c$SELECT * FROM idempotency.inbox$c$),
    (6, $c$DELETE FROM idempotency.inbox$c$),
    (7, $c$SELECT * FROM idempotency.locks$c$),
    (8, $c$UPDATE idempotency.locks SET expires_at = now()$c$),
    (9, $c$SELECT nextval('idempotency.token_seq')$c$),
    (10, $c$SELECT * FROM idempotency.idem_stats$c$),
    (11, $c$SELECT * FROM idempotency.idem_stuck$c$),
    (12, $c$SELECT * FROM idempotency.idem_maintenance()$c$),
    (13, $c$SELECT idempotency.boundary_selftest('error')$c$),
    (14, $c$CREATE TABLE idempotency.intruder (i int)$c$),
    (15, $c$CREATE FUNCTION idempotency.intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'$c$),
    (16, $c$SELECT * FROM idempotency.outbox$c$),
    (17, $c$INSERT INTO idempotency.outbox (topic, payload, enqueued_at, available_at, updated_at) VALUES ('priv.events', '{}', now(), now(), now())$c$),
    (18, $c$UPDATE idempotency.outbox SET state = 'delivered'$c$),
    (19, $c$DELETE FROM idempotency.outbox$c$),
    (20, $c$SELECT nextval('idempotency.outbox_id_seq')$c$),
    (21, $c$SELECT * FROM idempotency.outbox_lag$c$),
    (22, $c$SELECT * FROM idempotency.outbox_dead_letters$c$),
    (23, $c$SELECT idempotency.outbox_redrive()$c$),
    (24, $c$SELECT idempotency.outbox_redrive(topic => 'priv.events')$c$)
) v(n, call) ORDER BY n;
-- A hostile search_path does not reach into the functions.
RESET ROLE;
CREATE SCHEMA regress_idem_evil AUTHORIZATION regress_idem_app;
SET ROLE regress_idem_app;
CREATE TABLE regress_idem_evil.idempotency_keys (LIKE app_tokens);
CREATE TABLE regress_idem_evil.outbox (LIKE app_tokens);
CREATE FUNCTION regress_idem_evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 42::bigint';
SET search_path = regress_idem_evil, public;
SELECT outcome, token <> 42 AS real_token FROM idempotency.idem_claim('priv-3');
SELECT count(*) AS untouched FROM regress_idem_evil.idempotency_keys;
SELECT idempotency.outbox_enqueue('priv.events', '{"n": 4}') > (SELECT token FROM app_tokens WHERE label = 'o2') AS real_id;
SELECT count(*) AS untouched FROM regress_idem_evil.outbox;
RESET search_path;
RESET ROLE;
DROP SCHEMA regress_idem_evil CASCADE;

-- ---------------------------------------------------------------- no USAGE
SET ROLE regress_idem_nobody;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('priv-4')$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.idem_stats$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_enqueue('priv.events', '{}')$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_lag$$);
RESET ROLE;

-- ---------------------------------------------------------------- pg_monitor
SET ROLE regress_idem_monitor;
SELECT scope, received, processing, completed, stuck FROM idempotency.idem_stats WHERE scope = 'priv';
SET idempotency.stuck_after = '1ms';
SELECT pg_sleep(0.01);
SELECT scope, key, status FROM idempotency.idem_stuck WHERE scope = 'priv';
RESET idempotency.stuck_after;
SELECT pg_temp.try($$SELECT * FROM idempotency.idempotency_keys$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.idem_maintenance()$$);
SELECT topic, pending, in_flight, retrying, dead FROM idempotency.outbox_lag WHERE topic = 'priv.events';
SELECT topic, key, payload, attempts, last_error FROM idempotency.outbox_dead_letters WHERE topic = 'priv.events';
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_redrive()$$);
RESET ROLE;

-- ---------------------------------------------------------------- the owner
SELECT scope, received, completed FROM idempotency.idem_stats WHERE scope = 'priv';
SELECT task FROM idempotency.idem_maintenance() ORDER BY task;
SELECT idempotency.outbox_redrive(topic => 'priv.events') AS redriven;
-- What the application role wrote is there.
SELECT key, status, attempts FROM idempotency.idempotency_keys WHERE key LIKE 'priv-%' ORDER BY key COLLATE "C";
SELECT key, payload, state, attempts, relay FROM idempotency.outbox WHERE topic = 'priv.events' ORDER BY id;

DROP TABLE app_tokens;
DROP OWNED BY regress_idem_app, regress_idem_monitor, regress_idem_nobody;
DROP ROLE regress_idem_app;
DROP ROLE regress_idem_monitor;
DROP ROLE regress_idem_nobody;
