-- churn, plain SQL: claim a new key (commits), then complete it (commits)
-- with an expiry :retention seconds away, as two_txn_plain.sql does with
-- 24 hours; purge_plain.sql deletes the expired keys.
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
INSERT INTO bench.idempotency_keys
       (scope, key, status, token, attempts, lease_until, created_at, updated_at,
        claimed_at, holder_pid)
SELECT 'default', :k, 'PROCESSING', nextval('bench.token_seq'), 1,
       clock_timestamp() + interval '30 seconds', clock_timestamp(), clock_timestamp(),
       clock_timestamp(), pg_backend_pid()
 WHERE NOT EXISTS (SELECT FROM bench.idempotency_keys WHERE scope = 'default' AND key = :k)
ON CONFLICT (scope, key) DO NOTHING
RETURNING token \gset
UPDATE bench.idempotency_keys
   SET status = 'COMPLETED', result = '{"status": 200, "order": 42, "ok": true}',
       completed_at = clock_timestamp(), updated_at = clock_timestamp(),
       expires_at = clock_timestamp() + make_interval(secs => :retention),
       next_attempt_at = NULL, lease_expired = false, holder_pid = NULL
 WHERE scope = 'default' AND key = :k AND token = :token AND status = 'PROCESSING'
RETURNING attempts \gset
