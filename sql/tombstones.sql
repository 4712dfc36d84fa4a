-- Two-tier retention: once a finished key's result has passed its
-- retention, the purge leaves a tombstone (a digest of scope and key, the
-- first bytes of the fingerprint, the final status, when it is forgotten),
-- kept idempotency.key_retention (or retain_key) from when the key
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
-- No tombstone yet, the table never analyzed: 0, not unknown.
SELECT tombstones FROM idempotency.idem_tombstones;
-- The digest as docs/keys.md writes it in SQL: the purge computes it so,
-- the claims in C++; the answers below find the purge's tombstones.
CREATE FUNCTION pg_temp.digest(scope text, key text) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(substr(sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                              || convert_to(key, 'UTF8')), 1, 16), 'hex')::uuid $$;

-- A completed key and a final failure, both past their result's retention.
INSERT INTO t SELECT 'done', token FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT outcome, result_expired
  FROM idempotency.idem_complete('tb-done', (SELECT token FROM t WHERE label = 'done'), '{"charge": 7}', retain => '0');
SET idempotency.retention = 0;  -- recorded by the claim
INSERT INTO t SELECT 'dead', token FROM idempotency.idem_claim('tb-dead', '{"amount": 3}', scope => 'payment');
SELECT idempotency.idem_fail('tb-dead', (SELECT token FROM t WHERE label = 'dead'), 'card refused', false, scope => 'payment');
RESET idempotency.retention;
-- A key and a scope beyond ASCII, without a request.
INSERT INTO t SELECT 'utf8', token FROM idempotency.idem_claim('clé-Ω-😀', scope => 'späť');
SELECT outcome FROM idempotency.idem_complete('clé-Ω-😀', (SELECT token FROM t WHERE label = 'utf8'), '{"ok": 1}', scope => 'späť', retain => '0');
-- A completed key whose result is still kept.
INSERT INTO t SELECT 'kept', token FROM idempotency.idem_claim('tb-kept');
SELECT outcome FROM idempotency.idem_complete('tb-kept', (SELECT token FROM t WHERE label = 'kept'), '{"ok": true}');

-- The purge moves the three keys into tombstones in one batch.
SELECT task, rows FROM idempotency.idem_maintenance()
 WHERE task IN ('settle_leases', 'purge_keys', 'purge_tombstones');
SELECT scope, key FROM idempotency.idempotency_keys ORDER BY key;
SELECT x.label, s.status, s.fingerprint IS NOT NULL AS has_fingerprint,
       s.forget_at - clock_timestamp() BETWEEN interval '29 days 23 hours' AND interval '30 days' AS kept_30_days
  FROM idempotency.key_tombstones s
  JOIN (VALUES ('done', 'default', 'tb-done'), ('dead', 'payment', 'tb-dead'),
               ('utf8', 'späť', 'clé-Ω-😀')) AS x(label, scope, key)
    ON s.key_digest = pg_temp.digest(x.scope, x.key)
 ORDER BY x.label;
-- The fingerprint's first 4 bytes, big-endian.
SELECT s.fingerprint = ('x' || encode(substr(sha256('{"amount": 1500}'::bytea), 1, 4), 'hex'))::bit(32)::int4
       AS first_four_bytes
  FROM idempotency.key_tombstones s WHERE s.key_digest = pg_temp.digest('default', 'tb-done');

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
-- The key beyond ASCII, found by the digest the purge computed in SQL.
SELECT outcome, status, result_expired FROM idempotency.idem_claim('clé-Ω-😀', scope => 'späť');
SELECT outcome, result_expired FROM idempotency.idem_claim('clé-Ω-😀', '{"any": "request"}', scope => 'späť');
-- Another request with the key: mismatch, against the tombstone's fingerprint.
SELECT outcome, status, result, result_expired
  FROM idempotency.idem_claim('tb-done', '{"amount": 9999}');
SELECT outcome, result_expired FROM idempotency.idem_register('tb-dead', '{"amount": 4}', scope => 'payment');
-- The same key in another scope is another key.
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', scope => 'other');
-- A key with its result answers as before, result_expired false.
SELECT outcome, result, result_expired FROM idempotency.idem_claim('tb-kept');

-- idem_get answers from the tombstone: status, result NULL, result_expired,
-- and expires_at when the tombstone is forgotten.
SELECT scope, key, status, token, result, created_at, result_expired,
       expires_at = (SELECT forget_at FROM idempotency.key_tombstones
                      WHERE key_digest = pg_temp.digest('default', 'tb-done')) AS expires_when_forgotten
  FROM idempotency.idem_get('tb-done');
SELECT scope, key, status, result_expired FROM idempotency.idem_get('tb-dead', 'payment');
SELECT status, result, result_expired FROM idempotency.idem_get('tb-kept');
SELECT idempotency.idem_get('tb-never') IS NULL AS unknown;
-- A holder's late call on a key gone but for its tombstone: no such key.
\set VERBOSITY sqlstate
SELECT idempotency.idem_complete('tb-done', (SELECT token FROM t WHERE label = 'done'));
\set VERBOSITY default

-- Answered in a read-only transaction too.
BEGIN TRANSACTION READ ONLY;
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT status, result_expired FROM idempotency.idem_get('tb-done');
COMMIT;

-- The duplicates left the tombstones as they were.
SELECT count(*) AS tombstones FROM idempotency.key_tombstones;

-- The views count them apart: idem_stats has the live and finished keys
-- (tb-kept and the two claimed just now), idem_tombstones the tombstones.
SELECT scope, received, processing, completed, failed_final FROM idempotency.idem_stats ORDER BY scope;
SELECT tombstones FROM idempotency.idem_tombstones;  -- NULL: rows, not analyzed yet
ANALYZE idempotency.key_tombstones;
SELECT tombstones, bytes > 0 AS has_bytes FROM idempotency.idem_tombstones;

-- Tombstones past forget_at are purged in batches; the key may then be
-- used again.
UPDATE idempotency.key_tombstones SET forget_at = clock_timestamp() - interval '1 second'
 WHERE key_digest = pg_temp.digest('default', 'tb-done');
SELECT task, rows FROM idempotency.idem_maintenance() WHERE task = 'purge_tombstones';
SELECT count(*) AS tombstones FROM idempotency.key_tombstones;
SELECT outcome, result_expired FROM idempotency.idem_claim('tb-done', '{"amount": 1500}');
SELECT status, result_expired FROM idempotency.idem_get('tb-done');  -- a live key again

-- ---------------------------------------------------------------- retention per call

-- retain_key on idem_complete: the tombstone's retention from when the key
-- finished, recorded on the key until the purge.
INSERT INTO t SELECT 'rk1', token FROM idempotency.idem_claim('rk-1');
SELECT outcome FROM idempotency.idem_complete('rk-1', (SELECT token FROM t WHERE label = 'rk1'), retain => '0', retain_key => '90 days');
SELECT key_retention FROM idempotency.idem_get('rk-1');
-- Zero: no tombstone (the key is forgotten with its result).
INSERT INTO t SELECT 'rk2', token FROM idempotency.idem_claim('rk-2');
SELECT outcome FROM idempotency.idem_complete('rk-2', (SELECT token FROM t WHERE label = 'rk2'), retain => '0', retain_key => '0');
-- NULL: the server's idempotency.key_retention, read by the purge.
INSERT INTO t SELECT 'rk3', token FROM idempotency.idem_claim('rk-3');
SELECT outcome FROM idempotency.idem_complete('rk-3', (SELECT token FROM t WHERE label = 'rk3'), retain => '0', retain_key => NULL);
SELECT key_retention FROM idempotency.idem_get('rk-3');
-- A tombstone's retention shorter than the result's: none either.
INSERT INTO t SELECT 'rk4', token FROM idempotency.idem_claim('rk-4');
SELECT outcome FROM idempotency.idem_complete('rk-4', (SELECT token FROM t WHERE label = 'rk4'), retain => '0', retain_key => '1 microsecond');
-- idem_fail: retain and retain_key of a final failure.
INSERT INTO t SELECT 'rf1', token FROM idempotency.idem_claim('rf-1');
SELECT idempotency.idem_fail('rf-1', (SELECT token FROM t WHERE label = 'rf1'), 'no', false,
                             retain => '0', retain_key => '2 days');
SELECT status, expires_at = updated_at AS result_gone_at_once, key_retention FROM idempotency.idem_get('rf-1');
-- A retryable failure keeps neither (it is not finished): the final one decides.
INSERT INTO t SELECT 'rf2', token FROM idempotency.idem_claim('rf-2');
SELECT idempotency.idem_fail('rf-2', (SELECT token FROM t WHERE label = 'rf2'), 'later', true,
                             retain => '0', retain_key => '2 days');
SELECT status, expires_at, key_retention FROM idempotency.idem_get('rf-2');
-- A later complete without retain_key clears an earlier one.
INSERT INTO t SELECT 'rk5', token FROM idempotency.idem_claim('rk-5');
SELECT idempotency.idem_fail('rk-5', (SELECT token FROM t WHERE label = 'rk5'), 'later', true, retry_in => '0');
UPDATE idempotency.idempotency_keys SET key_retention = '5 days' WHERE key = 'rk-5';
UPDATE t SET token = (SELECT token FROM idempotency.idem_claim('rk-5')) WHERE label = 'rk5';
SELECT outcome FROM idempotency.idem_complete('rk-5', (SELECT token FROM t WHERE label = 'rk5'));
SELECT key_retention FROM idempotency.idem_get('rk-5');

SELECT task, rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys';
SELECT x.key, s.status, round(extract(epoch FROM s.forget_at - clock_timestamp()) / 86400) AS days_left
  FROM (VALUES ('rk-1'), ('rk-2'), ('rk-3'), ('rk-4'), ('rf-1')) AS x(key)
  LEFT JOIN idempotency.key_tombstones s ON s.key_digest = pg_temp.digest('default', x.key)
 ORDER BY x.key;
SELECT outcome, result_expired FROM idempotency.idem_claim('rk-1');
SELECT outcome, result_expired FROM idempotency.idem_claim('rf-1');
-- Without a tombstone the key is new again.
SELECT outcome, result_expired FROM idempotency.idem_claim('rk-2');

-- Out of range: negative, or more than 100 years (22023); a NULL is the
-- default.
\set VERBOSITY sqlstate
INSERT INTO t SELECT 'bad', token FROM idempotency.idem_claim('rk-bad');
SELECT idempotency.idem_complete('rk-bad', (SELECT token FROM t WHERE label = 'bad'), retain_key => '-1 second');
SELECT idempotency.idem_complete('rk-bad', (SELECT token FROM t WHERE label = 'bad'), retain_key => '101 years');
SELECT idempotency.idem_complete('rk-bad', (SELECT token FROM t WHERE label = 'bad'), retain_key => '1000000 years');
SELECT idempotency.idem_fail('rk-bad', (SELECT token FROM t WHERE label = 'bad'), 'x', false, retain_key => '-1 day');
SELECT idempotency.idem_fail('rk-bad', (SELECT token FROM t WHERE label = 'bad'), 'x', false, retain => '-1 day');
SELECT idempotency.idem_fail('rk-bad', (SELECT token FROM t WHERE label = 'bad'), 'x', false, retain => '200 years');
\set VERBOSITY default
SELECT status FROM idempotency.idem_get('rk-bad');
SELECT outcome FROM idempotency.idem_complete('rk-bad', (SELECT token FROM t WHERE label = 'bad'), retain_key => '100 years');
SELECT key_retention FROM idempotency.idem_get('rk-bad');

\c contrib_regression
DROP DATABASE idem_tomb;
