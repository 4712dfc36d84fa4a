-- CREATE EXTENSION and the objects it creates; who may create it; DROP and
-- CREATE again in one session.
CREATE EXTENSION idempotency;
SELECT e.extname, e.extversion, e.extrelocatable, n.nspname AS schema
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'idempotency';
-- The functions, with argument names, order and defaults.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace ORDER BY p.proname COLLATE "C";
-- The state machine's states.
SELECT enum_range(NULL::idempotency.idem_status);
-- idem_outcome.
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.idem_outcome'::regclass AND a.attnum > 0
 ORDER BY a.attnum;
-- The outbox: the states of an event, and the row outbox_claim returns.
SELECT enum_range(NULL::idempotency.outbox_state);
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.outbox_delivery'::regclass AND a.attnum > 0
 ORDER BY a.attnum;
-- The columns of idempotency_keys that users rely on (idem_get's row type).
SELECT c AS column_name, format_type(a.atttypid, a.atttypmod) AS type
  FROM unnest(ARRAY['scope', 'key', 'status', 'token', 'attempts', 'lease_until', 'next_attempt_at',
                    'fingerprint', 'result', 'last_error', 'job_ref', 'created_at', 'updated_at',
                    'completed_at', 'expires_at']) WITH ORDINALITY u(c, n)
  LEFT JOIN pg_attribute a ON a.attrelid = 'idempotency.idempotency_keys'::regclass AND a.attname = u.c
 ORDER BY u.n;
SELECT pg_get_function_result('idempotency.idem_get(text, text)'::regprocedure) AS idem_get_returns;
-- Every object of the extension is in schema idempotency.
SELECT count(*) AS objects_elsewhere
  FROM pg_depend d JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND d.deptype = 'e' AND c.relnamespace <> 'idempotency'::regnamespace;
-- Not relocatable.
\set VERBOSITY sqlstate
ALTER EXTENSION idempotency SET SCHEMA public;
\set VERBOSITY default

-- Only a superuser may create the extension.
SELECT token AS t FROM idempotency.idem_claim('setup-1') \gset
SELECT outcome FROM idempotency.idem_complete('setup-1', :t, '"before"');
-- Every outbox statement runs once in this session before the DROP.
SELECT idempotency.outbox_enqueue('setup.t', '"before"', dedup_key => 'setup-d') AS e \gset
SELECT idempotency.outbox_enqueue('setup.t', '"before, again"', dedup_key => 'setup-d') = :e AS deduplicated;
SELECT idempotency.outbox_enqueue('setup.t', '"before 2"') > :e AS enqueued;
SELECT payload, attempt FROM idempotency.outbox_claim('setup-relay') ORDER BY id;
SELECT idempotency.outbox_nack(:e, 'e', false);
SELECT idempotency.outbox_redrive() AS redriven;
SELECT idempotency.outbox_ack(ARRAY[:e]) AS acked;
SELECT task, rows FROM idempotency.idem_maintenance() WHERE task LIKE '%outbox%' ORDER BY task COLLATE "C";
-- DROP EXTENSION refuses to destroy undelivered work: "before 2" is in
-- flight and a key is PROCESSING; so does DROP SCHEMA ... CASCADE.
SELECT outcome FROM idempotency.idem_claim('setup-processing');
DROP EXTENSION idempotency;
DROP SCHEMA idempotency CASCADE;
-- So does a session of a replication tool or a restore
-- (session_replication_role = replica).
SET session_replication_role = replica;
DROP EXTENSION idempotency;
RESET session_replication_role;
-- A transaction that holds outbox claims it has not written yet cannot
-- drop it at all, forced or not.
SELECT idempotency.outbox_enqueue('setup.t', '"held"') AS held \gset
BEGIN;
SELECT payload FROM idempotency.outbox_claim('setup-relay', topics => '{setup.t}');
SET LOCAL idempotency.force_drop = on;
DROP EXTENSION idempotency;
ROLLBACK;
-- idempotency.force_drop (superuser) lets it go.
SET idempotency.force_drop = on;
DROP EXTENSION idempotency;
RESET idempotency.force_drop;
CREATE ROLE regress_idem_creator;
GRANT CREATE ON DATABASE contrib_regression TO regress_idem_creator;
SET ROLE regress_idem_creator;
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
\set VERBOSITY default
RESET ROLE;

-- A schema named idempotency that another role created first (a database
-- owner can) is refused: that role could rename it and put look-alike
-- objects under the old names. So is one that already holds objects.
\set SHOW_CONTEXT never
DROP SCHEMA idempotency;  -- the empty schema DROP EXTENSION leaves
SET ROLE regress_idem_creator;
CREATE SCHEMA idempotency;
RESET ROLE;
CREATE EXTENSION idempotency;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'idempotency';
DROP SCHEMA idempotency;
CREATE SCHEMA idempotency;
CREATE TABLE idempotency.intruder (i int);
CREATE EXTENSION idempotency;
DROP SCHEMA idempotency CASCADE;
\set SHOW_CONTEXT errors
REVOKE CREATE ON DATABASE contrib_regression FROM regress_idem_creator;
DROP ROLE regress_idem_creator;

-- CREATE again in the same session: the functions work on the new objects
-- (nothing cached from the dropped ones is used).
CREATE EXTENSION idempotency;
SELECT idempotency.idem_get('setup-1') IS NULL AS fresh;
SELECT outcome, status, attempt FROM idempotency.idem_claim('setup-1');
SELECT token AS t FROM idempotency.idem_get('setup-1') \gset
SELECT outcome, status, result FROM idempotency.idem_complete('setup-1', :t, '"after"');
SELECT outcome, status, result FROM idempotency.idem_claim('setup-1');
SELECT outcome, status FROM idempotency.idem_register('setup-2', NULL, 'job');
SELECT idempotency.idem_fail('setup-3', (idempotency.idem_claim('setup-3')).token, 'e', false);
SELECT idempotency.inbox_receive('setup-m1') AS first_time;
SELECT idempotency.idem_lock('setup-r1') IS NOT NULL AS locked;
SELECT idempotency.outbox_enqueue('setup.t', '"after"', dedup_key => 'setup-d') AS e \gset
SELECT count(*) AS events, min(payload::text) AS payload FROM idempotency.outbox;
SELECT idempotency.outbox_enqueue('setup.t', '"after, again"', dedup_key => 'setup-d') = :e AS deduplicated;
SELECT payload, attempt FROM idempotency.outbox_claim('setup-relay');
SELECT idempotency.outbox_nack(:e, 'e', false);
SELECT idempotency.outbox_redrive() AS redriven;
SELECT payload, attempt FROM idempotency.outbox_claim('setup-relay');
SELECT idempotency.outbox_ack(ARRAY[:e]) AS acked;
SELECT topic, pending, in_flight, retrying, dead, last_delivered_at IS NOT NULL AS delivered FROM idempotency.outbox_lag;
SELECT count(*) AS dead_letters FROM idempotency.outbox_dead_letters;
SELECT task FROM idempotency.idem_maintenance() ORDER BY task COLLATE "C";
SELECT scope, received, completed, failed_final FROM idempotency.idem_stats WHERE scope = 'default';
