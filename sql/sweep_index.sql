-- The keys' sweep indexes and HOT updates: no index follows lease_until,
-- and a complete leaves active_since (which the live keys' index follows)
-- and purge_at to the sweep, so a heartbeat and a complete change no
-- indexed column and are HOT updates; the next sweep then settles a
-- finished key: it leaves the live keys' index and is filed for retention
-- by purge_at. Runs in a database of its own so that the row counts of
-- idem_maintenance() are exact.
CREATE DATABASE idem_sweep;
\c idem_sweep
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE TEMP TABLE t (label text PRIMARY KEY, token bigint);
-- Plain types only, so that the helper outlives DROP EXTENSION below.
CREATE FUNCTION pg_temp.key(p_key text) RETURNS TABLE (
    status text, live boolean, has_lease boolean, filed_at_expiry boolean, has_purge_at boolean)
LANGUAGE sql AS $$
    SELECT status::text, active_since IS NOT NULL, lease_until IS NOT NULL, purge_at = expires_at,
           purge_at IS NOT NULL
      FROM idempotency.idempotency_keys WHERE key = p_key
$$;

-- Heartbeats are HOT updates, however many. (The session's statistics are
-- flushed before and after, so that the counts here and below are their
-- transactions' own.)
INSERT INTO t SELECT 'b1', token FROM idempotency.idem_claim('s-beat');
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT count(idempotency.idem_heartbeat('s-beat', (SELECT token FROM t WHERE label = 'b1'), '1 min'))
       AS heartbeats
  FROM generate_series(1, 20);
SELECT pg_stat_get_xact_tuples_updated('idempotency.idempotency_keys'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('idempotency.idempotency_keys'::regclass) AS hot;
COMMIT;
SELECT * FROM pg_temp.key('s-beat');
SELECT outcome FROM idempotency.idem_complete('s-beat', (SELECT token FROM t WHERE label = 'b1'));
SELECT pg_stat_force_next_flush();

-- A complete with the usual retention is a HOT update, in the two-phase
-- pattern (claim committed, complete in its own transaction) ...
INSERT INTO t SELECT 'h1', token FROM idempotency.idem_claim('s-hot-1');
BEGIN;
SELECT outcome FROM idempotency.idem_complete('s-hot-1', (SELECT token FROM t WHERE label = 'h1'), '{"ok": 1}');
SELECT pg_stat_get_xact_tuples_updated('idempotency.idempotency_keys'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('idempotency.idempotency_keys'::regclass) AS hot;
COMMIT;
-- ... and in one transaction with the claim.
BEGIN;
INSERT INTO t SELECT 'h2', token FROM idempotency.idem_claim('s-hot-2');
SELECT outcome FROM idempotency.idem_complete('s-hot-2', (SELECT token FROM t WHERE label = 'h2'), '{"ok": 2}');
SELECT pg_stat_get_xact_tuples_updated('idempotency.idempotency_keys'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('idempotency.idempotency_keys'::regclass) AS hot;
COMMIT;
-- The completed keys stay in the live keys' index, with their lease, until
-- the sweep settles them.
SELECT * FROM pg_temp.key('s-hot-1');

-- A retention shorter than the lease left files the key at once (not HOT),
-- and so settles it in the same write, one row version: it leaves the live
-- keys' index with its lease, and the sweep purges it without settling it
-- first or waiting for the lease to end.
INSERT INTO t SELECT 'r0', token FROM idempotency.idem_claim('s-retain-0', lease => '1h');
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT outcome FROM idempotency.idem_complete('s-retain-0', (SELECT token FROM t WHERE label = 'r0'), retain => '0');
SELECT pg_stat_get_xact_tuples_updated('idempotency.idempotency_keys'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('idempotency.idempotency_keys'::regclass) AS hot;
COMMIT;
SELECT * FROM pg_temp.key('s-retain-0');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT count(*) AS left_over FROM idempotency.idempotency_keys WHERE key = 's-retain-0';

-- A final failure is filed at once, and settled in the same write too; a
-- retryable one is settled by its write, not filed (a retry's claim then
-- never finds the sweep holding the row).
INSERT INTO t SELECT 'ff', token FROM idempotency.idem_claim('s-final', lease => '1h');
SELECT idempotency.idem_fail('s-final', (SELECT token FROM t WHERE label = 'ff'), 'boom', false);
SELECT * FROM pg_temp.key('s-final');
INSERT INTO t SELECT 'fr', token FROM idempotency.idem_claim('s-retryable', lease => '1h');
SELECT idempotency.idem_fail('s-retryable', (SELECT token FROM t WHERE label = 'fr'), 'boom', true);
SELECT * FROM pg_temp.key('s-retryable');

-- The next sweep settles a finished key, whether its lease has ended or
-- not: the key leaves the live keys' index and is filed for retention at
-- its expires_at.
INSERT INTO t SELECT 's1', token FROM idempotency.idem_claim('s-settle', lease => '1h');
SELECT outcome FROM idempotency.idem_complete('s-settle', (SELECT token FROM t WHERE label = 's1'));
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.key('s-settle');
SELECT * FROM pg_temp.key('s-hot-1');

-- A lease the sweep expired and settled (no lease_until left): the late
-- holder may still complete, and the key is filed at its new expires_at.
INSERT INTO t SELECT 'l1', token FROM idempotency.idem_claim('s-late', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.key('s-late');
SELECT outcome, status FROM idempotency.idem_complete('s-late', (SELECT token FROM t WHERE label = 'l1'), '{"late": true}');
SELECT * FROM pg_temp.key('s-late');

-- A key filed for a retention that then moved later (expired to
-- FAILED_FINAL with retention 0, then completed late with retain 1h) is not
-- purged at the old time: the sweep files it again.
SET idempotency.max_attempts = 1;
SET idempotency.retention = 0;
INSERT INTO t SELECT 'f1', token FROM idempotency.idem_claim('s-refile', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT outcome, status FROM idempotency.idem_claim('s-refile');
SELECT * FROM pg_temp.key('s-refile');
RESET idempotency.retention;
RESET idempotency.max_attempts;
SELECT outcome, status FROM idempotency.idem_complete('s-refile', (SELECT token FROM t WHERE label = 'f1'), retain => '1h');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.key('s-refile');

-- A claim of a key not settled yet keeps the time it became live (and its
-- entry in the live keys' index): here the takeover of an ended lease; a
-- settled key (a failure settles its key) is live again from its next
-- claim.
INSERT INTO t SELECT 'a1', token FROM idempotency.idem_claim('s-again', lease => '50ms');
SELECT active_since AS first_live FROM idempotency.idempotency_keys WHERE key = 's-again' \gset
SELECT pg_sleep(0.1);
INSERT INTO t SELECT 'a2', token FROM idempotency.idem_claim('s-again');
SELECT status, active_since = :'first_live' AS kept_its_time
  FROM idempotency.idempotency_keys WHERE key = 's-again';
SELECT idempotency.idem_fail('s-again', (SELECT token FROM t WHERE label = 'a2'), 'boom', true, retry_in => '0s');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.key('s-again');
INSERT INTO t SELECT 'a3', token FROM idempotency.idem_claim('s-again');
SELECT status, active_since > :'first_live' AS live_again
  FROM idempotency.idempotency_keys WHERE key = 's-again';
SELECT outcome FROM idempotency.idem_complete('s-again', (SELECT token FROM t WHERE label = 'a3'));

-- The sweeps find their rows through their indexes, whatever the statistics
-- say (on tables this small the planner would rather scan them): no
-- sequential scan of the extension's tables in a maintenance run, and the
-- caller's planner settings are back afterwards.
INSERT INTO t SELECT 'x1', token FROM idempotency.idem_claim('s-index', lease => '50ms');
SELECT idempotency.inbox_receive('s-index-message', 's-index');
SELECT pg_sleep(0.1);
-- (The session's earlier scans are flushed first: the counts below are the
-- maintenance run's alone.)
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT count(*) > 0 AS ran FROM idempotency.idem_maintenance();
SELECT relname, seq_scan, idx_scan > 0 AS used_an_index FROM pg_stat_xact_user_tables
 WHERE schemaname = 'idempotency' AND relname IN ('idempotency_keys', 'inbox', 'locks', 'outbox')
 ORDER BY relname;
COMMIT;
SHOW enable_seqscan;
SHOW enable_bitmapscan;

-- A session that worked on a database of 0.2.0 (no purge_at: the library
-- uses the statements of that layout) sees the update at once: after
-- ALTER EXTENSION UPDATE its complete with a short retention files the key.
DROP EXTENSION idempotency;
SET client_min_messages = warning;
CREATE EXTENSION idempotency VERSION '0.2.0';
RESET client_min_messages;
TRUNCATE t;
INSERT INTO t SELECT 'o1', token FROM idempotency.idem_claim('s-old-1');
SELECT outcome FROM idempotency.idem_complete('s-old-1', (SELECT token FROM t WHERE label = 'o1'), retain => '0');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
ALTER EXTENSION idempotency UPDATE;
INSERT INTO t SELECT 'o2', token FROM idempotency.idem_claim('s-old-2');
SELECT outcome FROM idempotency.idem_complete('s-old-2', (SELECT token FROM t WHERE label = 'o2'), retain => '0');
SELECT * FROM pg_temp.key('s-old-2');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT count(*) AS left_over FROM idempotency.idempotency_keys;

\c contrib_regression
DROP DATABASE idem_sweep;
