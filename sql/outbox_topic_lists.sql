-- outbox_claim over a long list of topics (16 or more distinct ones) reads
-- every topic and keeps its own, and reads its topics one by one once the
-- events of other topics it passes over cost more: either way it hands out
-- the oldest due events of its topics, in order, and none of another
-- topic, and leaves the claims over every topic exact. Runs in a database
-- of its own so that claims over every topic are exact.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_topic_lists;
\c idem_outbox_topic_lists
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- expected(list, batch): the ids a claim should hand out, by SQL.
CREATE FUNCTION pg_temp.expected(list text[], batch int) RETURNS bigint[] LANGUAGE sql AS $f$
    SELECT coalesce(array_agg(id ORDER BY ready_at, id), '{}') FROM (
        SELECT id, ready_at FROM idempotency.outbox
         WHERE topic = ANY (list) AND state = 'pending' AND ready_at <= clock_timestamp()
         ORDER BY ready_at, id LIMIT batch) e
$f$;
-- claimed(relay, list, batch): the ids outbox_claim hands out, in its order.
CREATE FUNCTION pg_temp.claimed(relay text, list text[], batch int) RETURNS bigint[]
LANGUAGE sql AS $f$
    SELECT coalesce(array_agg(c.id ORDER BY c.ordinality), '{}')
      FROM idempotency.outbox_claim(relay, batch, topics => list) WITH ORDINALITY c
$f$;
CREATE FUNCTION pg_temp.topics(first int, last int) RETURNS text[] LANGUAGE sql AS $f$
    SELECT array_agg('t' || lpad(i::text, 2, '0') ORDER BY i) FROM generate_series(first, last) i
$f$;
CREATE TEMP TABLE want (name text PRIMARY KEY, ids bigint[]);

-- Ten events of topic 'other', then three of each of t01..t40.
SELECT count(idempotency.outbox_enqueue('other', '{}')) FROM generate_series(1, 10);
SELECT count(idempotency.outbox_enqueue('t' || lpad(t::text, 2, '0'), jsonb_build_object('n', n)))
  FROM generate_series(1, 3) n, generate_series(1, 40) t;

-- t01..t20 (20 topics): the 25 oldest of theirs, none of another topic.
INSERT INTO want VALUES ('first', pg_temp.expected(pg_temp.topics(1, 20), 25));
SELECT cardinality(ids) AS wanted FROM want WHERE name = 'first';
SELECT pg_temp.claimed('r1', pg_temp.topics(1, 20), 25) = ids AS oldest_of_its_topics_in_order
  FROM want WHERE name = 'first';
SELECT count(*) FILTER (WHERE topic = 'other') AS other, count(*) FILTER (WHERE topic > 't20') AS unlisted,
       count(*) AS in_flight
  FROM idempotency.outbox WHERE state = 'in_flight';
-- The same list again, in another order and with repeats: the next 35 of them.
INSERT INTO want VALUES ('rest', pg_temp.expected(pg_temp.topics(1, 20), 100));
SELECT cardinality(ids) AS wanted FROM want WHERE name = 'rest';
SELECT pg_temp.claimed('r1', array_cat(ARRAY(SELECT unnest(pg_temp.topics(1, 20)) ORDER BY 1 DESC),
                                      pg_temp.topics(5, 10)), 100) = ids AS the_rest
  FROM want WHERE name = 'rest';
-- The claim over every topic still finds the ten older events of 'other' first.
SELECT array_agg(topic ORDER BY id) = array_fill('other'::text, ARRAY[10]) AS others_first
  FROM idempotency.outbox_claim('r2', 10);

-- 2000 more events of 'other', then one more of each of t21..t40: a claim
-- of t21..t40 finds their first 60, passes over more events of 'other'
-- than it may (4 per listed topic), reads its topics one by one from
-- there, and hands out all 80 of its own, in order.
SELECT count(idempotency.outbox_enqueue('other', '{}')) FROM generate_series(1, 2000);
SELECT count(idempotency.outbox_enqueue('t' || lpad(t::text, 2, '0'), '{"late": true}'))
  FROM generate_series(21, 40) t;
INSERT INTO want VALUES ('split', pg_temp.expected(pg_temp.topics(21, 40), 100));
SELECT cardinality(ids) AS wanted FROM want WHERE name = 'split';
SELECT pg_temp.claimed('r3', pg_temp.topics(21, 40), 100) = ids AS oldest_past_the_others
  FROM want WHERE name = 'split';
SELECT count(*) AS other_in_flight FROM idempotency.outbox WHERE state = 'in_flight' AND topic = 'other';
-- Nothing of those topics is left, and 'other' is all the claim over every topic finds.
SELECT pg_temp.claimed('r3', pg_temp.topics(21, 40), 10) AS none_left;
SELECT count(*) AS handed, bool_and(topic = 'other') AS all_other
  FROM idempotency.outbox_claim('r4', 3000);

-- A list of 100000 topics, five of which have events.
SELECT count(idempotency.outbox_enqueue('x' || i, '{}')) FROM generate_series(1, 5) i;
SELECT count(*) AS handed, min(topic), max(topic)
  FROM idempotency.outbox_claim('r5', 100,
                                topics => ARRAY(SELECT 'x' || i FROM generate_series(1, 100000) i));

-- A backend keeps the set of the last list it claimed over: a list that
-- differs from it in one topic (same length in bytes) gets a set of its
-- own, short (one read per topic) or long (16 topics or more: one read of
-- every topic, filtered), and a list with a NULL is refused after it.
SELECT count(idempotency.outbox_enqueue('y' || i, '{}')) FROM generate_series(1, 3) i;
CREATE FUNCTION pg_temp.claimed_topics(list text[]) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(topic, ',' ORDER BY topic) FROM idempotency.outbox_claim('r6', 10, topics => list)
$$;
BEGIN; SELECT pg_temp.claimed_topics('{y1,y2}') AS y1_y2; ROLLBACK;
BEGIN; SELECT pg_temp.claimed_topics('{y1,y3}') AS y1_y3; ROLLBACK;
BEGIN; SELECT pg_temp.claimed_topics('{y1,y2}') AS y1_y2_again; ROLLBACK;
BEGIN; SELECT pg_temp.claimed_topics('{y2,y3}' || pg_temp.topics(41, 58)) AS long_y2_y3; ROLLBACK;
BEGIN; SELECT pg_temp.claimed_topics('{y1,y3}' || pg_temp.topics(41, 58)) AS long_y1_y3; ROLLBACK;
SELECT count(*) FROM idempotency.outbox_claim('r6', 10, topics => '{y1,NULL}');
SELECT count(*) FROM idempotency.outbox_claim('r6', 10, topics => '{y1,""}');
SELECT pg_temp.claimed_topics('{y3}') AS y3_after_the_errors;

\c contrib_regression
DROP DATABASE idem_outbox_topic_lists;
