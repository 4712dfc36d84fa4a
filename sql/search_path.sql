-- A hostile search_path: the functions run as their owner, so an object the
-- caller puts ahead of pg_catalog (operators for the types the statements
-- compare, functions they call, a temporary table with a table's name) must
-- never be used by them. Every trap below raises a NOTICE naming the user it
-- ran as; none may appear, and every call must still give its usual answer.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE ROLE regress_idem_sp_app;
SELECT idempotency.grant_application('regress_idem_sp_app');
SELECT idempotency.grant_relay('regress_idem_sp_app');
CREATE SCHEMA trap;
GRANT USAGE ON SCHEMA trap TO regress_idem_sp_app;

CREATE FUNCTION trap.sprung(what text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    RAISE NOTICE 'trap % ran as %', what, current_user;
END $f$;
CREATE FUNCTION trap.text_eq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('text ='); RETURN a OPERATOR(pg_catalog.=) b; END $f$;
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.text_eq);
CREATE FUNCTION trap.int8_eq(a bigint, b bigint) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('bigint ='); RETURN a OPERATOR(pg_catalog.=) b; END $f$;
CREATE OPERATOR trap.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = trap.int8_eq);
CREATE FUNCTION trap.ts_le(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('timestamptz <='); RETURN a OPERATOR(pg_catalog.<=) b; END $f$;
CREATE OPERATOR trap.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = trap.ts_le);
CREATE FUNCTION trap.int4_plus(a integer, b integer) RETURNS integer LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('integer +'); RETURN a OPERATOR(pg_catalog.+) b; END $f$;
CREATE OPERATOR trap.+ (LEFTARG = integer, RIGHTARG = integer, FUNCTION = trap.int4_plus);
CREATE FUNCTION trap.status_eq(a idempotency.idem_status, b idempotency.idem_status)
RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('idem_status ='); RETURN a::text OPERATOR(pg_catalog.=) b::text; END $f$;
CREATE OPERATOR trap.= (LEFTARG = idempotency.idem_status, RIGHTARG = idempotency.idem_status,
                        FUNCTION = trap.status_eq);
CREATE FUNCTION trap.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('nextval'); RETURN 1; END $f$;
CREATE FUNCTION trap.now() RETURNS timestamptz LANGUAGE plpgsql AS $f$
BEGIN PERFORM trap.sprung('now'); RETURN '2000-01-01'; END $f$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA trap TO regress_idem_sp_app;

-- The caller's session: the trap schema first, then pg_catalog, and a
-- temporary table named like the keys table.
SET ROLE regress_idem_sp_app;
SET search_path = trap, pg_catalog, pg_temp;
CREATE TEMP TABLE idempotency_keys (scope text, key text);
CREATE TEMP TABLE tokens (label text, token bigint);
-- The traps are armed: the caller's own comparisons use them.
SELECT 'a'::text = 'a'::text AS armed;

SELECT outcome, status FROM idempotency.idem_register('sp-1', '{"a": 1}', 'job-1');
INSERT INTO tokens SELECT 'k1', token FROM idempotency.idem_claim('sp-1', '{"a": 1}');
SELECT outcome, status FROM idempotency.idem_claim('sp-1', '{"a": 1}');
SELECT idempotency.idem_heartbeat('sp-1', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'k1'), '1 min') IS NOT NULL AS heartbeat;
SELECT idempotency.idem_assert_owner('sp-1', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'k1'));
SELECT outcome, status, result FROM idempotency.idem_complete('sp-1', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'k1'), '{"ok": 1}');
SELECT outcome, status, result FROM idempotency.idem_claim('sp-1', '{"a": 1}');
SELECT status, job_ref, result FROM idempotency.idem_get('sp-1');
INSERT INTO tokens SELECT 'k2', token FROM idempotency.idem_claim('sp-2');
SELECT idempotency.idem_fail('sp-2', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'k2'), 'oops', retry_in => '0');
INSERT INTO tokens SELECT 'k3', token FROM idempotency.idem_claim('sp-2');
SELECT idempotency.idem_release('sp-2', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'k3'));
SELECT status, attempts FROM idempotency.idem_get('sp-2');
SELECT idempotency.inbox_receive('sp-m1', 'app') AS first_time, idempotency.inbox_receive('sp-m1', 'app') AS again;
INSERT INTO tokens SELECT 'l1', idempotency.idem_lock('sp-res', '1 min', 'app');
SELECT idempotency.idem_lock_renew('sp-res', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'l1')) IS NOT NULL AS renewed;
SELECT idempotency.idem_lock_assert('sp-res', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'l1'));
SELECT idempotency.idem_unlock('sp-res', (SELECT token FROM tokens WHERE label OPERATOR(pg_catalog.=) 'l1')) AS unlocked;
SELECT idempotency.outbox_enqueue('sp-topic', '{"n": 1}', 'k') IS NOT NULL AS enqueued;
SELECT idempotency.outbox_enqueue('sp-topic', '{"n": 2}', 'k', dedup_key => 'd1') IS NOT NULL AS enqueued;
CREATE TEMP TABLE claimed AS
    SELECT id, topic, key, payload, attempt FROM idempotency.outbox_claim('sp-relay', 10, topics => ARRAY['sp-topic']);
SELECT topic, key, payload, attempt FROM claimed;
SELECT idempotency.outbox_nack((SELECT id FROM claimed), 'try again', retry_in => '0');
SELECT topic, key, payload, attempt FROM idempotency.outbox_claim('sp-relay', 10, topics => ARRAY['sp-topic']);
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM claimed)) AS acked;
-- The temporary table was not touched; the keys live in idempotency's table.
SELECT count(*) AS temp_rows FROM pg_temp.idempotency_keys;
RESET search_path;
RESET ROLE;
SELECT scope, key, status FROM idempotency.idempotency_keys WHERE key LIKE 'sp-%' ORDER BY key;
SELECT topic, key, state FROM idempotency.outbox WHERE topic = 'sp-topic' ORDER BY id;

DROP SCHEMA trap CASCADE;
DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'sp-%';
DELETE FROM idempotency.outbox WHERE topic = 'sp-topic';
DELETE FROM idempotency.inbox WHERE message_id = 'sp-m1';
DROP OWNED BY regress_idem_sp_app;
DROP ROLE regress_idem_sp_app;
