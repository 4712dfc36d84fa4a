-- two_txn, plain SQL: claim a new key (commits), then complete it (commits).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
-- claim, as the client sends it. A new key is one INSERT; the NOT EXISTS
-- guard keeps a duplicate from spending a sequence value (and, every 32nd
-- value, a transaction id and a WAL flush) on a row it will not insert.
\set token 0
INSERT INTO bench.idempotency_keys
       (scope, key, status, token, attempts, lease_until, created_at, updated_at,
        claimed_at, holder_pid)
SELECT 'default', :k, 'PROCESSING', nextval('bench.token_seq'), 1,
       clock_timestamp() + interval '30 seconds', clock_timestamp(), clock_timestamp(),
       clock_timestamp(), pg_backend_pid()
 WHERE NOT EXISTS (SELECT FROM bench.idempotency_keys WHERE scope = 'default' AND key = :k)
ON CONFLICT (scope, key) DO NOTHING
RETURNING token \aset
\if :token = 0
-- The key exists: read its state (a plain read; no lock, no transaction id).
-- state 1 = completed (replay result), 2 = claimable (take over),
-- 3 = expired with no attempts left (dead letter), 0 = in progress / retry
-- later / failed (answer from the row).
SELECT CASE WHEN status = 'COMPLETED' THEN 1
            WHEN status = 'PROCESSING' AND lease_until <= clock_timestamp()
                 AND attempts >= 5 THEN 3
            WHEN status = 'RECEIVED'
                 OR (status = 'PROCESSING' AND lease_until <= clock_timestamp())
                 OR (status = 'FAILED_RETRYABLE' AND next_attempt_at <= clock_timestamp())
                 THEN 2
            ELSE 0 END AS state,
       attempts, result, last_error
  FROM bench.idempotency_keys WHERE scope = 'default' AND key = :k \gset
\if :state = 2
-- Take over with a new token; the WHERE clause re-checks under the row lock.
UPDATE bench.idempotency_keys
   SET status = 'PROCESSING', token = nextval('bench.token_seq'), attempts = attempts + 1,
       lease_until = clock_timestamp() + interval '30 seconds', claimed_at = clock_timestamp(),
       updated_at = clock_timestamp(), next_attempt_at = NULL, expires_at = NULL,
       lease_expired = false, holder_pid = pg_backend_pid()
 WHERE scope = 'default' AND key = :k
   AND (status = 'RECEIVED'
        OR (status = 'PROCESSING' AND lease_until <= clock_timestamp() AND attempts < 5)
        OR (status = 'FAILED_RETRYABLE' AND next_attempt_at <= clock_timestamp()))
RETURNING token, attempts \aset
\elif :state = 3
UPDATE bench.idempotency_keys
   SET status = 'FAILED_FINAL', last_error = 'lease expired', lease_expired = true,
       next_attempt_at = clock_timestamp(), updated_at = clock_timestamp(),
       expires_at = clock_timestamp() + interval '24 hours', holder_pid = NULL
 WHERE scope = 'default' AND key = :k AND status = 'PROCESSING'
   AND lease_until <= clock_timestamp()
\endif
\endif
-- complete: one guarded UPDATE; no row back means a stale token (the
-- client would then read the row to tell IK001 / IK002 / IK003 apart).
UPDATE bench.idempotency_keys
   SET status = 'COMPLETED', result = '{"status": 200, "order": 42, "ok": true}',
       completed_at = clock_timestamp(), updated_at = clock_timestamp(),
       expires_at = clock_timestamp() + interval '24 hours', next_attempt_at = NULL,
       lease_expired = false, holder_pid = NULL
 WHERE scope = 'default' AND key = :k AND token = :token AND status = 'PROCESSING'
RETURNING attempts, result \gset
