-- relay of the queue cases: one transaction per batch: claim up to 100 due
-- events of topic bench and ack them; when nothing was due, wait 10 ms.
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids, count(*) AS n
  FROM idempotency.outbox_claim('bench-relay', 100, '1 min', '{bench}') \gset
SELECT idempotency.outbox_ack(:ids) AS acked \gset
COMMIT;
\if :n = 0
\sleep 10 ms
\endif
