-- The plain SQL purge beside churn_plain.sql: the expired keys deleted
-- once a second (by the partial index on expires_at the churn run makes),
-- as the extension's worker does with purge_naptime 1s.
DELETE FROM bench.idempotency_keys WHERE expires_at < clock_timestamp();
\sleep 1 s
