-- The ready queue: what a claim reads follows the batch it hands out and the
-- keys it looks at, not the events waiting behind a blocked head, another
-- topic's backlog, or acked events not yet vacuumed; and heads are handed
-- out oldest first, so a key with a huge backlog cannot starve the others.
-- The bounds are on the rows and index pages this transaction read
-- (PostgreSQL's statistics of the running transaction), never on time.
-- Runs in a database of its own, with autovacuum off for the outbox so that
-- dead entries stay.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_queue;
\c idem_outbox_queue
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
ALTER TABLE idempotency.outbox SET (autovacuum_enabled = off);

-- What this transaction has read of the outbox so far: rows (index entries
-- returned, and rows of sequential scans) and index pages.
CREATE FUNCTION pg_temp.reads(OUT visited bigint, OUT pages bigint) LANGUAGE sql AS $f$
    SELECT pg_stat_get_xact_tuples_returned('idempotency.outbox'::regclass)
           + sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint,
           sum(pg_stat_get_xact_blocks_fetched(i.indexrelid))::bigint
      FROM pg_index i WHERE i.indrelid = 'idempotency.outbox'::regclass $f$;
-- Claims and acks `batch` events of `topics` (NULL: every topic) in one
-- transaction; returns how many.
CREATE FUNCTION pg_temp.deliver(relay text, batch int, topics text[] DEFAULT NULL) RETURNS bigint
LANGUAGE sql AS $f$
    SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim(relay, batch, '1 min', topics))) $f$;

-- ---------------------------------------------------------------- a blocked chain
-- 20,000 events of one key whose head is in flight at another relay (a
-- ten-minute lease), then 300 events of other keys. A claim of 100 reads
-- about its batch: not the 19,999 events waiting behind the head.
SELECT count(idempotency.outbox_enqueue('q.chain', jsonb_build_object('n', n), 'stuck'))
  FROM generate_series(1, 20000) n;
SELECT count(*) AS in_flight_head FROM idempotency.outbox_claim('relay-x', 10, '10 min', '{q.chain}');
SELECT count(idempotency.outbox_enqueue('q.chain', jsonb_build_object('n', n), 'k' || n))
  FROM generate_series(1, 300) n;
BEGIN;
SELECT visited AS before FROM pg_temp.reads() \gset
SELECT count(*) AS handed FROM idempotency.outbox_claim('relay-b', 100, '1 min', '{q.chain}');
SELECT visited - :before < 1000 AS read_about_the_batch FROM pg_temp.reads();
COMMIT;
-- The same with a claim of every topic.
BEGIN;
SELECT visited AS before FROM pg_temp.reads() \gset
SELECT count(*) AS handed FROM idempotency.outbox_claim('relay-b', 100, '1 min');
SELECT visited - :before < 1000 AS read_about_the_batch FROM pg_temp.reads();
COMMIT;
-- None of the waiting events was handed out.
SELECT count(*) FILTER (WHERE state = 'in_flight') AS stuck_in_flight,
       count(*) FILTER (WHERE ready_at IS NOT NULL) AS stuck_heads
  FROM idempotency.outbox WHERE key = 'stuck';

-- ---------------------------------------------------------------- another topic's backlog
-- 20,000 pending events of q.analytics do not slow a claim of q.payments.
SELECT count(idempotency.outbox_enqueue('q.analytics', jsonb_build_object('n', n)))
  FROM generate_series(1, 20000) n;
SELECT count(idempotency.outbox_enqueue('q.payments', jsonb_build_object('n', n), 'p' || n))
  FROM generate_series(1, 300) n;
BEGIN;
SELECT visited AS before FROM pg_temp.reads() \gset
SELECT count(*) AS handed FROM idempotency.outbox_claim('relay-p', 100, '1 min', '{q.payments}');
SELECT visited - :before < 1000 AS read_about_the_batch FROM pg_temp.reads();
COMMIT;

-- ---------------------------------------------------------------- acked, not vacuumed
-- Every event so far delivered: their dead index entries stay (no vacuum).
-- A claim after them reads a few index pages, not the pages they fill.
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox WHERE state = 'in_flight')) > 0 AS acked;
SELECT sum(pg_temp.deliver('relay-d', 1000)) > 0 AS delivered FROM generate_series(1, 30);
SELECT count(*) AS live FROM idempotency.outbox WHERE state IN ('pending', 'in_flight') AND key IS DISTINCT FROM 'stuck';
SELECT count(idempotency.outbox_enqueue('q.after', jsonb_build_object('n', n))) FROM generate_series(1, 200) n;
BEGIN;
SELECT visited AS before, pages AS pages_before FROM pg_temp.reads() \gset
SELECT count(*) AS handed FROM idempotency.outbox_claim('relay-d', 100, '1 min');
SELECT pages - :pages_before < 40 AS read_few_pages, visited - :before < 1000 AS read_about_the_batch
  FROM pg_temp.reads();
COMMIT;
SELECT pg_temp.deliver('relay-d', 1000) >= 0 AS drained;

-- ---------------------------------------------------------------- fairness
-- One key with 1,000,000 pending events (its head enqueued first, the
-- others written as the enqueue writes waiting events: no ready_at), then
-- 1,000 keys with one event each. Heads are handed out oldest first, and
-- each next head of the hot key queues behind the heads ready before it:
-- all 1,000 are delivered within 11 claims of 100, and the hot key keeps
-- its order (one event in flight at a time).
SELECT idempotency.outbox_enqueue('q.fair', '{"n": 0}', 'hot') > 0 AS head;
INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at, updated_at)
SELECT 'q.fair', 'hot', jsonb_build_object('n', n), now(), now(), now() FROM generate_series(1, 999999) n;
SELECT count(idempotency.outbox_enqueue('q.fair', jsonb_build_object('n', n), 'single-' || n))
  FROM generate_series(1, 1000) n;
BEGIN;
SELECT visited AS before FROM pg_temp.reads() \gset
SELECT pg_temp.deliver('relay-f', 100, '{q.fair}') AS first_claim;
SELECT visited - :before < 1000 AS read_about_the_batch FROM pg_temp.reads();
COMMIT;
SELECT sum(pg_temp.deliver('relay-f', 100, '{q.fair}')) AS next_ten_claims FROM generate_series(1, 10);
SELECT count(*) FILTER (WHERE key LIKE 'single-%' AND state = 'delivered') AS singles_delivered,
       count(*) FILTER (WHERE key = 'hot' AND state = 'delivered') AS hot_delivered,
       count(*) FILTER (WHERE key = 'hot' AND state = 'pending') AS hot_pending
  FROM idempotency.outbox WHERE topic = 'q.fair';

\c contrib_regression
DROP DATABASE idem_outbox_queue;
