-- outbox_claim hands out a full batch when a batch of due events is
-- eligible, however many events ahead of them in id order it may not hand
-- out: a hot key's 10000 pending events ahead of other keys' events, and
-- keys whose first event is in flight with their next event waiting behind
-- it. Runs in a database of its own so that claims over every topic are exact.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_starvation;
\c idem_outbox_starvation
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE TEMP TABLE got (round int NOT NULL, id bigint NOT NULL, key text);
-- claim(round, relay, batch): outbox_claim, remembered in got; prints how
-- many events it handed out, how many of key 'hot', and the least and
-- greatest other key.
CREATE FUNCTION pg_temp.claim(r int, relay text, batch int)
RETURNS TABLE (handed bigint, hot bigint, first_other text, last_other text)
LANGUAGE sql AS $f$
    WITH c AS (INSERT INTO got SELECT r, o.id, o.key FROM idempotency.outbox_claim(relay, batch) o
               RETURNING id, key)
    SELECT count(*), count(*) FILTER (WHERE key = 'hot'),
           min(key) FILTER (WHERE key <> 'hot'), max(key) FILTER (WHERE key <> 'hot')
      FROM c
$f$;
-- The events of key 'hot' that are in flight, by their number n.
CREATE FUNCTION pg_temp.hot_in_flight() RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce(string_agg(payload->>'n', ',' ORDER BY id), 'none')
      FROM idempotency.outbox WHERE key = 'hot' AND state = 'in_flight'
$f$;

-- 10000 events of key 'hot', then one event each of keys k001..k150.
SELECT count(idempotency.outbox_enqueue('orders', jsonb_build_object('n', i), key => 'hot'))
  FROM generate_series(1, 10000) i;
SELECT count(idempotency.outbox_enqueue('orders', jsonb_build_object('n', i),
                                        key => 'k' || lpad(i::text, 3, '0')))
  FROM generate_series(1, 150) i;
-- One claim of 100: the hot key's first event and the first 99 other keys.
SELECT * FROM pg_temp.claim(1, 'r1', 100);
SELECT pg_temp.hot_in_flight();
-- In id order: hot first, then k001..k099.
SELECT array_agg(key ORDER BY id) = ARRAY['hot'] || ARRAY(
           SELECT 'k' || lpad(i::text, 3, '0') FROM generate_series(1, 99) i) AS in_id_order
  FROM got WHERE round = 1;
-- The next claim: the other 51 keys, nothing of hot (its first is in flight).
SELECT * FROM pg_temp.claim(2, 'r2', 100);
SELECT pg_temp.hot_in_flight();
-- Once everything handed out is acked, hot's second event, alone.
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM got)) AS acked;
SELECT * FROM pg_temp.claim(3, 'r1', 100);
SELECT pg_temp.hot_in_flight();
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM got WHERE round = 3)) AS acked;

-- 500 keys with two events each (a first and a second round), then 100
-- events of other keys. With the 500 first events in flight, a claim of 100
-- walks past them and the 500 events waiting behind them to the 100 others.
-- Only then (first events acked) does the second round come out, in id order.
UPDATE idempotency.outbox SET state = 'delivered', delivered_at = now() WHERE key = 'hot';
SELECT count(idempotency.outbox_enqueue('orders', jsonb_build_object('round', r),
                                        key => 'p' || lpad(i::text, 3, '0')))
  FROM generate_series(1, 2) r, generate_series(1, 500) i;
SELECT count(idempotency.outbox_enqueue('orders', '{}', key => 'q' || lpad(i::text, 3, '0')))
  FROM generate_series(1, 100) i;
SELECT * FROM pg_temp.claim(4, 'r1', 500);
SELECT * FROM pg_temp.claim(5, 'r2', 100);
SELECT * FROM pg_temp.claim(6, 'r2', 100);
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM got WHERE round = 4)) AS acked;
SELECT * FROM pg_temp.claim(7, 'r2', 100);
SELECT bool_and(o.payload->>'round' = '2') AS second_round, min(g.key), max(g.key)
  FROM got g JOIN idempotency.outbox o USING (id) WHERE g.round = 7;
-- Never two events of one key in flight.
SELECT count(*) AS keys_with_two_in_flight FROM (
    SELECT key FROM idempotency.outbox WHERE state = 'in_flight' AND key IS NOT NULL
     GROUP BY topic, key HAVING count(*) > 1) k;

\c contrib_regression
DROP DATABASE idem_outbox_starvation;
