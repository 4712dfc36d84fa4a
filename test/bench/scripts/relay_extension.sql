-- relay, extension: one transaction per batch: claim up to 100 due events
-- (per-key order, leases) and ack the ids claimed; when nothing was due,
-- wait 10 ms before the next poll (a relay would LISTEN).
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids, count(*) AS n
  FROM idempotency.outbox_claim('bench-relay', 100) \gset
SELECT idempotency.outbox_ack(:ids) AS acked \gset
COMMIT;
\if :n = 0
\sleep 10 ms
\endif
