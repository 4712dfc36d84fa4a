-- Two-tier retention: once a finished key's result has passed its
-- retention, the purge leaves a tombstone (scope, key, fingerprint, final
-- status, finished_at), kept idempotency.key_retention from when the key
-- finished. A late duplicate is answered from it (completed or failed,
-- result NULL, result_expired true) and the key is never created again. In
-- a database of its own so that the maintenance counts are exact.
CREATE DATABASE idem_tomb;
\c idem_tomb
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE TEMP TABLE t (label text PRIMARY KEY, token bigint);
SHOW idempotency.key_retention;

-- A completed key and a final failure, both past their result's retention.
INSERT INTO t SELECT 'done', token FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT outcome, result_expired
  FROM idempotency.idem_complete('tb-done', (SELECT token FROM t WHERE label = 'done'), '{"charge": 7}', retain => '0');
SET idempotency.retention = 0;  -- recorded by the claim
INSERT INTO t SELECT 'dead', token FROM idempotency.idem_claim('tb-dead', '{"amount": 3}', scope => 'payment');
SELECT idempotency.idem_fail('tb-dead', (SELECT token FROM t WHERE label = 'dead'), 'card refused', false, scope => 'payment');
RESET idempotency.retention;
-- A completed key whose result is still kept.
INSERT INTO t SELECT 'kept', token FROM idempotency.idem_claim('tb-kept');
SELECT outcome FROM idempotency.idem_complete('tb-kept', (SELECT token FROM t WHERE label = 'kept'), '{"ok": true}');

-- The purge moves the two keys into tombstones in one batch.
SELECT task, rows FROM idempotency.idem_maintenance()
 WHERE task IN ('settle_leases', 'purge_keys', 'purge_tombstones');
SELECT scope, key FROM idempotency.idempotency_keys ORDER BY key;
SELECT scope, key, status, length(fingerprint) AS fingerprint_bytes,
       forget_at - finished_at AS kept_for
  FROM idempotency.key_tombstones ORDER BY key;

-- A duplicate after the result's expiry: completed, no result, nothing created.
SELECT outcome, status, token, attempt, result, error, result_expired
  FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT outcome, status, result, result_expired FROM idempotency.idem_claim('tb-done');
SELECT outcome, status, result, result_expired FROM idempotency.idem_register('tb-done', '{"amount": 1500.0}');
-- Twice in a row: the second claim reads first (the first created no key).
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT count(*) AS keys_created FROM idempotency.idempotency_keys WHERE key = 'tb-done';
-- The final failure answers failed, without its error.
SELECT outcome, status, error, result_expired
  FROM idempotency.idem_claim('tb-dead', '{"amount": 3}', scope => 'payment');
-- Another request with the key: mismatch, against the tombstone's fingerprint.
SELECT outcome, status, result, result_expired
  FROM idempotency.idem_claim('tb-done', '{"amount": 9999}');
SELECT outcome, result_expired FROM idempotency.idem_register('tb-dead', '{"amount": 4}', scope => 'payment');
-- The same key in another scope is another key.
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', scope => 'other');
-- A key with its result answers as before, result_expired false.
SELECT outcome, result, result_expired FROM idempotency.idem_claim('tb-kept');

-- Answered in a read-only transaction too.
BEGIN TRANSACTION READ ONLY;
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
COMMIT;

-- The duplicates left the tombstones as they were.
SELECT count(*) AS tombstones FROM idempotency.key_tombstones;

-- Tombstones past forget_at are purged in batches; the key may then be
-- used again.
UPDATE idempotency.key_tombstones SET forget_at = clock_timestamp() - interval '1 second'
 WHERE key = 'tb-done';
SELECT task, rows FROM idempotency.idem_maintenance() WHERE task = 'purge_tombstones';
SELECT key FROM idempotency.key_tombstones ORDER BY key;
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');

\c contrib_regression
DROP DATABASE idem_tomb;
