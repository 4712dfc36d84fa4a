-- idem_maintenance(): one sweep of the worker's housekeeping: lease expiry
-- (FAILED_RETRYABLE / FAILED_FINAL), key retention, inbox retention, expired
-- locks, in batches of idempotency.purge_batch. Runs in a database of its
-- own so that the row counts are exact.
CREATE DATABASE idem_maint;
\c idem_maint
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE TEMP TABLE t (label text PRIMARY KEY, token bigint);
-- Nothing to do.
SELECT * FROM idempotency.idem_maintenance();

-- Leases that run out, finished keys past their retention, expired locks.
INSERT INTO t SELECT 'retry', token FROM idempotency.idem_claim('m-retry', lease => '0.2s');
INSERT INTO t SELECT 'final-1', token FROM idempotency.idem_claim('m-final');
SELECT idempotency.idem_fail('m-final', (SELECT token FROM t WHERE label = 'final-1'), 'first', retry_in => '0');
SET idempotency.max_attempts = 2;  -- recorded by the claim, for the sweep
INSERT INTO t SELECT 'final-2', token FROM idempotency.idem_claim('m-final', lease => '0.2s');
RESET idempotency.max_attempts;
INSERT INTO t SELECT 'live', token FROM idempotency.idem_claim('m-live', lease => '1 min');
INSERT INTO t SELECT 'done-now', token FROM idempotency.idem_claim('m-done-now');
SELECT outcome FROM idempotency.idem_complete('m-done-now', (SELECT token FROM t WHERE label = 'done-now'), retain => '0');
INSERT INTO t SELECT 'done-later', token FROM idempotency.idem_claim('m-done-later');
SELECT outcome FROM idempotency.idem_complete('m-done-later', (SELECT token FROM t WHERE label = 'done-later'));
SET idempotency.retention = 0;
INSERT INTO t SELECT 'dead-now', token FROM idempotency.idem_claim('m-dead-now');
SELECT idempotency.idem_fail('m-dead-now', (SELECT token FROM t WHERE label = 'dead-now'), 'fatal', false);
RESET idempotency.retention;
INSERT INTO t SELECT 'dead-later', token FROM idempotency.idem_claim('m-dead-later');
SELECT idempotency.idem_fail('m-dead-later', (SELECT token FROM t WHERE label = 'dead-later'), 'fatal', false);
INSERT INTO t SELECT 'waiting', token FROM idempotency.idem_claim('m-waiting');
SELECT idempotency.idem_fail('m-waiting', (SELECT token FROM t WHERE label = 'waiting'), 'later', retry_in => '1 hour');
SELECT outcome FROM idempotency.idem_register('m-received');
SELECT idempotency.idem_lock('l-expired', '0.2s') IS NOT NULL AS locked,
       idempotency.idem_lock('l-live', '1 min') IS NOT NULL AS locked;
SELECT idempotency.inbox_receive('old-1', 'maint'), idempotency.inbox_receive('old-2', 'maint');
SELECT pg_sleep(0.3);

-- The sweep honours the attempt cap each claim recorded, not its own
-- setting: m-final has used 2 of the 2 its claim allowed (the default is 5).
SELECT * FROM idempotency.idem_maintenance();
SELECT key, status, attempts, last_error, lease_expired,
       next_attempt_at <= clock_timestamp() AS claimable_now,
       expires_at - updated_at AS retained_for
  FROM idempotency.idempotency_keys ORDER BY key COLLATE "C";
SELECT resource FROM idempotency.locks ORDER BY 1;
-- PROCESSING -> FAILED_RETRYABLE by expiry: claimable at once, with a new token.
SELECT outcome, status, attempt, token > (SELECT max(token) FROM t) AS new_token
  FROM idempotency.idem_claim('m-retry');
-- PROCESSING -> FAILED_FINAL by expiry: failed.
SELECT outcome, status, attempt, error FROM idempotency.idem_claim('m-final');
-- Purged keys are gone from the table; what idem_get finds of them is
-- their tombstone (sql/tombstones.sql).
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE key IN ('m-done-now', 'm-dead-now')) AS left_in_table,
       (idempotency.idem_get('m-done-now')).result_expired AS done_tombstone,
       (idempotency.idem_get('m-dead-now')).result_expired AS dead_tombstone;
-- A second sweep finds nothing.
SELECT * FROM idempotency.idem_maintenance();

-- Batches of idempotency.purge_batch rows; inbox rows older than
-- idempotency.inbox_retention. Both are server-wide settings.
ALTER SYSTEM SET idempotency.purge_batch = 2;
ALTER SYSTEM SET idempotency.inbox_retention = '1s';
SELECT pg_reload_conf();
SELECT count(*) AS keys FROM (
    SELECT idempotency.idem_complete('m-batch-' || n,
                                     (idempotency.idem_claim('m-batch-' || n)).token, retain => '0')
      FROM generate_series(1, 5) n) c;
SELECT count(idempotency.idem_lock('l-batch-' || n, '0.1s')) AS locks FROM generate_series(1, 3) n;
SELECT pg_sleep(1.1);
SHOW idempotency.purge_batch;
SHOW idempotency.inbox_retention;
SELECT idempotency.inbox_receive('new-1', 'maint');
SELECT * FROM idempotency.idem_maintenance();
SELECT count(*) AS keys_left FROM idempotency.idempotency_keys WHERE key LIKE 'm-batch-%';
SELECT count(*) AS locks_left FROM idempotency.locks WHERE resource LIKE 'l-batch-%';
-- The recent message is still known; the old ones were forgotten.
SELECT idempotency.inbox_receive('new-1', 'maint') AS first_time;
SELECT idempotency.inbox_receive('old-1', 'maint') AS first_time;
ALTER SYSTEM RESET idempotency.purge_batch;
ALTER SYSTEM RESET idempotency.inbox_retention;
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SHOW idempotency.purge_batch;
SHOW idempotency.inbox_retention;
\c contrib_regression
DROP DATABASE idem_maint;
