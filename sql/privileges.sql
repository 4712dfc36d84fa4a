-- Privileges: no function is executable by PUBLIC. Four kinds of role get
-- their rights from grant_application, grant_relay (by topic),
-- grant_monitoring and grant_admin: each calls what its kind needs and is
-- refused the rest; none touches a table. revoke_role takes it all back.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '(token|event) -?[0-9]+', '\1 N', 'g');
END $f$;
CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_relay;       -- every topic
CREATE ROLE regress_idem_relay_a;     -- topic priv.a only
CREATE ROLE regress_idem_monitor;
CREATE ROLE regress_idem_admin;
CREATE ROLE regress_idem_pgmon;
CREATE ROLE regress_idem_nobody;
SELECT idempotency.grant_application('regress_idem_app');
SELECT idempotency.grant_relay('regress_idem_relay');
SELECT idempotency.grant_relay('regress_idem_relay_a', '{priv.a}');
SELECT idempotency.grant_monitoring('regress_idem_monitor');
SELECT idempotency.grant_admin('regress_idem_admin');
GRANT pg_monitor TO regress_idem_pgmon;
-- A scratch table every role may write, for tokens and ids.
CREATE TEMP TABLE saved (label text PRIMARY KEY, value bigint);
GRANT ALL ON saved TO PUBLIC;
CREATE FUNCTION pg_temp.v(l text) RETURNS bigint LANGUAGE sql AS $$SELECT value FROM saved WHERE label = l$$;

-- What each kind may execute. No function is SECURITY DEFINER or carries a
-- SET clause but the admin helpers (the C code switches to the owner and
-- pins the search path; sql/search_path.sql proves the pin).
SELECT p.proname, p.prosecdef AS definer, p.proconfig IS NOT NULL AS has_config,
       coalesce((SELECT bool_or(a.grantee = 0) FROM aclexplode(p.proacl) a), true) AS public,
       has_function_privilege('regress_idem_app', p.oid, 'EXECUTE') AS app,
       has_function_privilege('regress_idem_relay', p.oid, 'EXECUTE') AS relay,
       has_function_privilege('regress_idem_monitor', p.oid, 'EXECUTE') AS monitor,
       has_function_privilege('regress_idem_pgmon', p.oid, 'EXECUTE') AS pg_monitor,
       has_function_privilege('regress_idem_admin', p.oid, 'EXECUTE') AS admin
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
 ORDER BY p.proname COLLATE "C";
SELECT c.relname, c.relkind,
       has_table_privilege('regress_idem_app', c.oid, 'SELECT') AS app,
       has_table_privilege('regress_idem_relay', c.oid, 'SELECT') AS relay,
       has_table_privilege('regress_idem_monitor', c.oid, 'SELECT') AS monitor,
       has_table_privilege('regress_idem_pgmon', c.oid, 'SELECT') AS pg_monitor,
       has_table_privilege('regress_idem_admin', c.oid, 'SELECT') AS admin,
       has_table_privilege('regress_idem_admin', c.oid, 'UPDATE') AS admin_update
  FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'v', 'S')
 ORDER BY c.relname COLLATE "C";
SELECT role, topics FROM idempotency.relay_grants ORDER BY role::text COLLATE "C";

-- ---------------------------------------------------------------- application
SET ROLE regress_idem_app;
SELECT outcome, status FROM idempotency.idem_register('priv-1', '{"a": 1}', 'job-1');
INSERT INTO saved SELECT 'k1', token FROM idempotency.idem_claim('priv-1', '{"a": 1}');
SELECT idempotency.idem_heartbeat('priv-1', pg_temp.v('k1'), '1 min') > now() AS heartbeat;
SELECT idempotency.idem_assert_owner('priv-1', pg_temp.v('k1'));
SELECT outcome, status, result FROM idempotency.idem_complete('priv-1', pg_temp.v('k1'), '{"ok": 1}');
SELECT status, job_ref, result FROM idempotency.idem_get('priv-1');
INSERT INTO saved SELECT 'k2', token FROM idempotency.idem_claim('priv-2');
SELECT idempotency.idem_fail('priv-2', pg_temp.v('k2'), 'oops', retry_in => '0');
INSERT INTO saved SELECT 'k3', token FROM idempotency.idem_claim('priv-2');
SELECT idempotency.idem_release('priv-2', pg_temp.v('k3'));
SELECT idempotency.inbox_receive('priv-m1', 'app') AS first_time, idempotency.inbox_receive('priv-m1', 'app') AS again;
INSERT INTO saved SELECT 'l1', idempotency.idem_lock('priv-res', '1 min', 'app');
SELECT idempotency.idem_lock_renew('priv-res', pg_temp.v('l1')) AS renewed;
SELECT idempotency.idem_lock_assert('priv-res', pg_temp.v('l1'));
SELECT idempotency.idem_unlock('priv-res', pg_temp.v('l1')) AS unlocked;
INSERT INTO saved SELECT 'a1', idempotency.outbox_enqueue('priv.a', '{"n": 1}', 'k1', '{"h": "v"}', 'priv-d1');
INSERT INTO saved SELECT 'a2', idempotency.outbox_enqueue('priv.a', '{"n": 2}', 'k2');
INSERT INTO saved SELECT 'b1', idempotency.outbox_enqueue('priv.b', '{"n": 3}', 'k1');
INSERT INTO saved SELECT 'b2', idempotency.outbox_enqueue('priv.b', '{"n": 4}', 'k2');
SELECT idempotency.outbox_enqueue('priv.a', '{"n": 9}', dedup_key => 'priv-d1') = pg_temp.v('a1') AS deduplicated;
-- Errors come through as for anybody.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('priv-2', 1)$$);
SELECT pg_temp.try($$SELECT idempotency.idem_complete('priv-missing', 1)$$);
-- Refused: the relay's functions, the views, administration, every table.
SELECT n, pg_temp.try(call) AS result FROM (VALUES
    (1, $c$SELECT * FROM idempotency.outbox_claim('app', 10)$c$),
    (2, $c$SELECT idempotency.outbox_ack(ARRAY[1::bigint])$c$),
    (3, $c$SELECT idempotency.outbox_nack(1, 'e')$c$),
    (4, $c$SELECT idempotency.outbox_release(ARRAY[1::bigint], 'app')$c$),
    (5, $c$SELECT idempotency.outbox_redrive()$c$),
    (6, $c$SELECT * FROM idempotency.idem_stats$c$),
    (7, $c$SELECT * FROM idempotency.outbox_lag$c$),
    (8, $c$SELECT * FROM idempotency.idem_metrics$c$),
    (9, $c$SELECT * FROM idempotency.idem_maintenance()$c$),
    (10, $c$SELECT idempotency.idem_metrics_reset()$c$),
    (11, $c$SELECT idempotency.grant_admin('regress_idem_app')$c$),
    (12, $c$SELECT idempotency.boundary_selftest('error')$c$),
    (13, $c$SELECT * FROM idempotency.idempotency_keys$c$),
    (14, $c$UPDATE idempotency.idempotency_keys SET status = 'COMPLETED'$c$),
    (15, $c$SELECT * FROM idempotency.outbox$c$),
    (16, $c$UPDATE idempotency.outbox SET state = 'delivered'$c$),
    (17, $c$SELECT * FROM idempotency.inbox$c$),
    (18, $c$SELECT * FROM idempotency.locks$c$),
    (19, $c$SELECT * FROM idempotency.relay_grants$c$),
    (20, $c$INSERT INTO idempotency.relay_grants VALUES ('regress_idem_app', NULL)$c$),
    (21, $c$SELECT nextval('idempotency.token_seq')$c$),
    (22, $c$CREATE TABLE idempotency.intruder (i int)$c$)
) v(n, call) ORDER BY n;
-- A hostile search_path does not reach into the functions.
RESET ROLE;
CREATE SCHEMA regress_idem_evil AUTHORIZATION regress_idem_app;
SET ROLE regress_idem_app;
CREATE TABLE regress_idem_evil.idempotency_keys (LIKE saved);
CREATE TABLE regress_idem_evil.outbox (LIKE saved);
CREATE FUNCTION regress_idem_evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 42::bigint';
SET search_path = regress_idem_evil, public;
SELECT outcome, token <> 42 AS real_token FROM idempotency.idem_claim('priv-3');
SELECT count(*) AS untouched FROM regress_idem_evil.idempotency_keys;
SELECT idempotency.outbox_enqueue('priv.c', '{"n": 5}') > pg_temp.v('b2') AS real_id;
SELECT count(*) AS untouched FROM regress_idem_evil.outbox;
RESET search_path;
RESET ROLE;
DROP SCHEMA regress_idem_evil CASCADE;

-- ---------------------------------------------------------------- a relay limited to priv.a
SET ROLE regress_idem_relay_a;
-- Without topics it claims only its own; naming another topic is refused.
SELECT c.topic, c.payload FROM idempotency.outbox_claim('relay-a', 10) c ORDER BY c.id;
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_claim('relay-a', 10, topics => '{priv.a,priv.b}')$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_claim('relay-a', 10, topics => '{priv.b}')$$);
SELECT idempotency.outbox_ack(ARRAY[pg_temp.v('a1')]) AS acked;
SELECT idempotency.outbox_nack(pg_temp.v('a2'), 'rejected', false) AS state;
-- Another topic's events are not its to ack, nack, release or redrive.
SELECT n, pg_temp.try(call) AS result FROM (VALUES
    (1, format('SELECT idempotency.outbox_ack(ARRAY[%s::bigint])', pg_temp.v('b1'))),
    (2, format('SELECT idempotency.outbox_ack(ARRAY[%s, %s]::bigint[])', pg_temp.v('a1'), pg_temp.v('b1'))),
    (3, format($$SELECT idempotency.outbox_nack(%s, 'e')$$, pg_temp.v('b1'))),
    (4, format($$SELECT idempotency.outbox_release(ARRAY[%s::bigint], 'relay-a')$$, pg_temp.v('b1'))),
    (5, $c$SELECT idempotency.outbox_redrive(topic => 'priv.b')$c$),
    (6, format('SELECT idempotency.outbox_redrive(ARRAY[%s::bigint])', pg_temp.v('b1'))),
    (11, format('SELECT idempotency.outbox_discard(ARRAY[%s::bigint])', pg_temp.v('b1'))),
    (7, $c$SELECT idempotency.idem_claim('relay-key')$c$),
    (8, $c$SELECT idempotency.outbox_enqueue('priv.a', '{}')$c$),
    (9, $c$SELECT * FROM idempotency.idem_stats$c$),
    (10, $c$SELECT * FROM idempotency.idem_maintenance()$c$)
) v(n, call) ORDER BY n;
-- Its own dead letter it may redrive, with or without naming it.
SELECT topic, pending, dead FROM idempotency.outbox_lag WHERE topic LIKE 'priv.%' ORDER BY topic;
SELECT idempotency.outbox_redrive() AS redriven;
RESET ROLE;
SELECT payload, state, attempts FROM idempotency.outbox WHERE topic = 'priv.a' ORDER BY id;

-- ---------------------------------------------------------------- a relay of every topic
SET ROLE regress_idem_relay;
INSERT INTO saved SELECT 'c' || row_number() OVER (ORDER BY c.id), c.id
  FROM idempotency.outbox_claim('relay-all', 10) c;
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_dead_letters$$) AS dead_letters;  -- not a monitoring role
RESET ROLE;
SELECT topic, payload, state, relay FROM idempotency.outbox WHERE state = 'in_flight' AND topic LIKE 'priv.%' ORDER BY id;
SET ROLE regress_idem_relay;
SELECT idempotency.outbox_release(ARRAY[pg_temp.v('c1')], 'relay-all') AS released;
SELECT idempotency.outbox_ack(ARRAY(SELECT value FROM saved WHERE label LIKE 'c%' AND label <> 'c1')) AS acked;
RESET ROLE;
SELECT payload, state, attempts FROM idempotency.outbox WHERE topic LIKE 'priv.%' ORDER BY id;

-- ---------------------------------------------------------------- monitoring and pg_monitor
SET ROLE regress_idem_monitor;
SELECT count(*) > 0 AS reads_stats FROM idempotency.idem_stats;
SELECT topic, pending, in_flight, dead FROM idempotency.outbox_lag WHERE topic LIKE 'priv.%' ORDER BY topic;
SELECT count(*) >= 0 AS reads_metrics FROM idempotency.idem_metrics;
SELECT n, pg_temp.try(call) AS result FROM (VALUES
    (1, $c$SELECT idempotency.idem_claim('monitor-key')$c$),
    (2, $c$SELECT * FROM idempotency.outbox_claim('monitor', 1)$c$),
    (3, $c$SELECT idempotency.idem_metrics_reset()$c$),
    (4, $c$SELECT * FROM idempotency.idempotency_keys$c$)
) v(n, call) ORDER BY n;
SET ROLE regress_idem_pgmon;
SELECT count(*) >= 0 AS reads_views FROM idempotency.idem_stuck;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('pgmon-key')$$);
RESET ROLE;

-- ---------------------------------------------------------------- admin
SET ROLE regress_idem_admin;
SELECT task FROM idempotency.idem_maintenance() ORDER BY task;
SELECT idempotency.outbox_redrive(topic => 'priv.b') AS redriven;
SELECT pg_temp.try($$SELECT idempotency.idem_metrics_reset()$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.idempotency_keys$$);
RESET ROLE;

-- ---------------------------------------------------------------- no rights
SET ROLE regress_idem_nobody;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('priv-4')$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.idem_stats$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_enqueue('priv.a', '{}')$$);
RESET ROLE;

-- ---------------------------------------------------------------- grant_relay's checks; revoke_role
SELECT pg_temp.try($$SELECT idempotency.grant_relay('regress_idem_relay_a', '{}')$$);
SELECT pg_temp.try($$SELECT idempotency.grant_relay('regress_idem_relay_a', '{a,NULL}')$$);
SELECT pg_temp.try($$SELECT idempotency.set_role_rights('regress_idem_app', 'wizard', false)$$);
SELECT idempotency.grant_relay('regress_idem_relay_a', '{priv.a,priv.b}');
SELECT role, topics FROM idempotency.relay_grants ORDER BY role::text COLLATE "C";
-- This session kept relay_a's topics from its calls above; each call sees
-- the grants it can see: the wider one at once, a narrower one inside a
-- transaction, the wider one again after that rolled back, and the topics
-- of a granted role while relay_a is a member of it.
CREATE FUNCTION pg_temp.claim_as_relay_a(topic text) RETURNS text LANGUAGE sql AS $f$
    SET ROLE regress_idem_relay_a;
    SELECT pg_temp.try(format($$SELECT * FROM idempotency.outbox_claim('relay-a', 1, topics => '{%s}')$$, topic));
$f$;
BEGIN;
SELECT pg_temp.claim_as_relay_a('priv.b') AS widened;
ROLLBACK;
BEGIN;
SELECT idempotency.grant_relay('regress_idem_relay_a', '{priv.a}');
SELECT pg_temp.claim_as_relay_a('priv.b') AS narrowed;
ROLLBACK;
BEGIN;
SELECT pg_temp.claim_as_relay_a('priv.b') AS after_rollback;
ROLLBACK;
BEGIN;
CREATE ROLE regress_idem_relay_c;
SELECT idempotency.grant_relay('regress_idem_relay_c', '{priv.c}');
GRANT regress_idem_relay_c TO regress_idem_relay_a;
SELECT pg_temp.claim_as_relay_a('priv.c') AS member;
ROLLBACK;
BEGIN;
SELECT pg_temp.claim_as_relay_a('priv.c') AS no_longer_member;
ROLLBACK;
SELECT idempotency.revoke_role(r) FROM unnest(ARRAY['regress_idem_app', 'regress_idem_relay',
    'regress_idem_relay_a', 'regress_idem_monitor', 'regress_idem_admin']::regrole[]) r;
SELECT count(*) AS grants_left FROM idempotency.relay_grants;
SELECT count(*) AS rights_left FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.pronamespace = 'idempotency'::regnamespace AND a.grantee::regrole::text LIKE 'regress_idem_%';
SET ROLE regress_idem_app;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('priv-after')$$);
RESET ROLE;

DROP TABLE saved;
DROP ROLE regress_idem_app, regress_idem_relay, regress_idem_relay_a, regress_idem_monitor,
    regress_idem_admin, regress_idem_pgmon, regress_idem_nobody;
