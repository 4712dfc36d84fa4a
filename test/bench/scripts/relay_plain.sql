-- relay, plain SQL: the loop a user writes by hand against bench.outbox, one
-- transaction per batch: take the 100 oldest ready events (SKIP LOCKED,
-- no per-key order, no deliver_at), mark them in flight, then delivered;
-- when nothing was pending, wait 10 ms before the next poll.
BEGIN;
WITH c AS (
    SELECT id FROM bench.outbox WHERE ready_at IS NOT NULL AND ready_at <= clock_timestamp()
     ORDER BY ready_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
u AS (
    UPDATE bench.outbox o
       SET state = 'in_flight', attempts = o.attempts + 1,
           lease_until = clock_timestamp() + interval '30 seconds', relay = 'bench-relay',
           updated_at = clock_timestamp(), ready_at = clock_timestamp() + interval '30 seconds'
      FROM c WHERE o.id = c.id
    RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts, o.enqueued_at)
SELECT coalesce(array_agg(id), '{}') AS ids, count(*) AS n FROM u \gset
UPDATE bench.outbox
   SET state = 'delivered', delivered_at = clock_timestamp(), lease_until = NULL,
       updated_at = clock_timestamp(), ready_at = NULL
 WHERE id = ANY (:ids) AND state = 'in_flight';
COMMIT;
\if :n = 0
\sleep 10 ms
\endif
