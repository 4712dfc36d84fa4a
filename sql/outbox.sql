-- Transactional outbox: outbox_enqueue, outbox_claim (batch, lease, topics,
-- order per (topic, key)), outbox_ack, outbox_nack, outbox_redrive, lease
-- expiry, the views outbox_lag and outbox_dead_letters, the outbox tasks of
-- idem_maintenance() and the NOTIFY on commit. Runs in databases of its own
-- so that claims over every topic and the counts are exact. Ids are printed
-- as the label of the enqueue that returned them.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox;
\c idem_outbox
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message'.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'event -?[0-9]+', 'event N', 'g');
END $f$;
-- Events this session has enqueued, by label.
CREATE TEMP TABLE ev (label text PRIMARY KEY, id bigint NOT NULL UNIQUE);
CREATE FUNCTION pg_temp.id(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT id FROM ev WHERE label = l $f$;
CREATE FUNCTION pg_temp.ids(VARIADIC l text[]) RETURNS bigint[] LANGUAGE sql AS $f$
    SELECT array_agg(e.id ORDER BY u.n) FROM unnest(l) WITH ORDINALITY u(label, n)
      JOIN ev e ON e.label = u.label $f$;
CREATE FUNCTION pg_temp.lbl(i bigint) RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce((SELECT label FROM ev WHERE id = i), 'unknown') $f$;
-- enq(label, topic, payload, ...): outbox_enqueue; 'new' for an id greater
-- than every id seen so far (then remembered under label), '=label' for the
-- id of an earlier event.
CREATE FUNCTION pg_temp.enq(l text, topic text, payload jsonb DEFAULT '{}', key text DEFAULT NULL,
                            headers jsonb DEFAULT NULL, dedup_key text DEFAULT NULL,
                            deliver_at timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    i bigint := idempotency.outbox_enqueue(topic, payload, key, headers, dedup_key, deliver_at);
    known text;
BEGIN
    SELECT e.label INTO known FROM ev e WHERE e.id = i;
    IF known IS NOT NULL THEN
        RETURN '=' || known;
    END IF;
    IF i <= (SELECT coalesce(max(e.id), 0) FROM ev e) THEN
        RETURN 'old, unseen';
    END IF;
    INSERT INTO ev VALUES (l, i);
    RETURN 'new';
END $f$;
-- claim(relay, batch, lease, topics): outbox_claim, in the order it returns
-- the events; enqueued_at is compared with the stored one.
CREATE FUNCTION pg_temp.claim(relay text, batch int DEFAULT 100, lease interval DEFAULT '1 hour',
                              topics text[] DEFAULT NULL)
RETURNS TABLE (event text, topic text, key text, payload jsonb, headers jsonb, dedup_key text,
               attempt int, enqueued_at_ok boolean)
LANGUAGE sql AS $f$
    SELECT pg_temp.lbl(d.id), d.topic, d.key, d.payload, d.headers, d.dedup_key, d.attempt,
           d.enqueued_at = (SELECT o.enqueued_at FROM idempotency.outbox o WHERE o.id = d.id)
      FROM idempotency.outbox_claim(relay, batch, lease, topics) WITH ORDINALITY d
     ORDER BY d.ordinality $f$;
-- events(topic pattern): the stored events, without timestamps: due (pending
-- and available now), leased (lease_until in the future), delivered (has
-- delivered_at).
CREATE FUNCTION pg_temp.events(pattern text)
RETURNS TABLE (event text, topic text, key text, state idempotency.outbox_state, attempts int,
               last_error text, relay text, due boolean, leased boolean, delivered boolean)
LANGUAGE sql AS $f$
    SELECT pg_temp.lbl(o.id), o.topic, o.key, o.state, o.attempts, o.last_error, o.relay,
           CASE WHEN o.state = 'pending' THEN o.available_at <= clock_timestamp() END,
           CASE WHEN o.lease_until IS NOT NULL THEN o.lease_until > clock_timestamp() END,
           o.delivered_at IS NOT NULL
      FROM idempotency.outbox o WHERE o.topic LIKE pattern ORDER BY o.id $f$;

-- ---------------------------------------------------------------- enqueue
-- A new event: pending, never handed out, due at once.
SELECT pg_temp.enq('a1', 'ob.a', '{"n": 1}');
SELECT pg_temp.enq('a2', 'ob.a', '{"n": 2}', key => 'k1', headers => '{"h": "v", "n": [1, 2]}',
                   dedup_key => 'd1');
-- Any JSON value is a payload.
SELECT pg_temp.enq('a3', 'ob.a', '"text"');
SELECT pg_temp.enq('a4', 'ob.a', 'null');
SELECT pg_temp.enq('a5', 'ob.a', '[1, {"x": true}]', headers => '{}');
SELECT pg_temp.lbl(o.id) AS event, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.state,
       o.attempts, o.last_error, o.relay, o.lease_until, o.delivered_at,
       o.available_at = o.enqueued_at AS due_when_enqueued, o.updated_at = o.enqueued_at AS unchanged,
       o.enqueued_at <= clock_timestamp() AS enqueued_in_the_past
  FROM idempotency.outbox o ORDER BY o.id;
-- Without a dedup_key every enqueue is a new event, even with equal contents.
SELECT pg_temp.enq('a6', 'ob.a', '{"n": 1}');
-- With one, a second enqueue of the same (topic, dedup_key) returns the first
-- event's id and inserts nothing (its payload, key and headers are not
-- stored); the same dedup_key in another topic is another event.
SELECT pg_temp.enq('a2-again', 'ob.a', '{"n": 99}', key => 'other', headers => '{"x": 1}',
                   dedup_key => 'd1');
SELECT pg_temp.enq('b1', 'ob.b', '{"n": 3}', dedup_key => 'd1');
SELECT pg_temp.enq('b1-again', 'ob.b', '{"n": 4}', dedup_key => 'd1');
SELECT pg_temp.lbl(id) AS event, topic, key, payload, headers, dedup_key
  FROM idempotency.outbox WHERE dedup_key = 'd1' ORDER BY id;
SELECT count(*) AS events FROM idempotency.outbox;
-- ... also twice in one transaction.
BEGIN;
SELECT pg_temp.enq('c1', 'ob.c', '{"n": 1}', dedup_key => 'd2');
SELECT pg_temp.enq('c1-again', 'ob.c', '{"n": 2}', dedup_key => 'd2');
COMMIT;
SELECT pg_temp.lbl(id) AS event, payload FROM idempotency.outbox WHERE topic = 'ob.c';

-- The event exists iff the enqueuing transaction commits.
BEGIN;
SELECT idempotency.outbox_enqueue('ob.rb', '{"n": 1}', dedup_key => 'd3') AS rb_id \gset
SELECT count(*) AS inside_the_transaction FROM idempotency.outbox WHERE id = :rb_id;
ROLLBACK;
SELECT count(*) AS after_rollback FROM idempotency.outbox WHERE id = :rb_id OR topic = 'ob.rb';
-- ... so its dedup_key was never taken.
SELECT pg_temp.enq('rb1', 'ob.rb', '{"n": 2}', dedup_key => 'd3');
SELECT pg_temp.id('rb1') > :rb_id AS later_id;
-- A savepoint rolled back takes its events with it.
BEGIN;
SELECT pg_temp.enq('sp1', 'ob.rb', '{"n": 3}');
SAVEPOINT s;
SELECT idempotency.outbox_enqueue('ob.rb', '{"n": 4}') IS NOT NULL AS enqueued;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT pg_temp.lbl(id) AS event, payload FROM idempotency.outbox WHERE topic = 'ob.rb' ORDER BY id;

-- deliver_at: not handed out before it is due; a time in the past is due at once.
SELECT pg_temp.enq('s1', 'ob.sched', '{"n": 1}', deliver_at => clock_timestamp() + interval '0.5s');
SELECT pg_temp.enq('s2', 'ob.sched', '{"n": 2}', deliver_at => clock_timestamp() - interval '1 hour');
SELECT pg_temp.lbl(id) AS event, available_at > enqueued_at AS later,
       available_at < enqueued_at - interval '59 min' AS an_hour_earlier
  FROM idempotency.outbox WHERE topic = 'ob.sched' ORDER BY id;
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.sched}');
SELECT * FROM pg_temp.events('ob.sched');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.sched}');
SELECT idempotency.outbox_ack(pg_temp.ids('s1', 's2')) AS acked;

-- ---------------------------------------------------------------- claim
-- topics NULL: every topic; lease NULL: idempotency.default_lease; batch
-- omitted: 100 (NULL is refused, 22004, and claims nothing). In id order,
-- attempt 1 the first time.
\set VERBOSITY sqlstate
SELECT * FROM idempotency.outbox_claim('relay-a', NULL, NULL, NULL);
\set VERBOSITY default
SELECT pg_temp.lbl(id) AS event, topic, key, payload, headers, dedup_key, attempt
  FROM idempotency.outbox_claim('relay-a', lease => NULL, topics => NULL);
SELECT state, count(*), bool_and(relay = 'relay-a') AS relay_a,
       bool_and(lease_until - updated_at = current_setting('idempotency.default_lease')::interval)
           AS default_lease,
       bool_and(lease_until > clock_timestamp()) AS lease_alive
  FROM idempotency.outbox GROUP BY state ORDER BY state;
-- Each event goes to one relay at a time: while its lease lives, nobody
-- gets it again.
SELECT * FROM pg_temp.claim('relay-a');
SELECT * FROM pg_temp.claim('relay-b');
SELECT idempotency.outbox_ack(array_agg(id)) AS acked FROM idempotency.outbox WHERE state = 'in_flight';
SELECT state, count(*) FROM idempotency.outbox GROUP BY state ORDER BY state;

-- batch: at most that many, the oldest first; the lease given.
SELECT pg_temp.enq('q' || n, 'ob.batch', jsonb_build_object('n', n)) FROM generate_series(1, 5) n;
SELECT * FROM pg_temp.claim('relay-a', 2, '5 min', '{ob.batch}');
SELECT * FROM pg_temp.claim('relay-b', 2, '10 min', '{ob.batch}');
SELECT * FROM pg_temp.claim('relay-a', 2, '5 min', '{ob.batch}');
SELECT * FROM pg_temp.claim('relay-a', 2, '5 min', '{ob.batch}');
SELECT pg_temp.lbl(id) AS event, state, attempts, relay,
       lease_until - updated_at = interval '5 min' AS lease_5_min,
       lease_until - updated_at = interval '10 min' AS lease_10_min
  FROM idempotency.outbox WHERE topic = 'ob.batch' ORDER BY id;
SELECT idempotency.outbox_ack(pg_temp.ids('q1', 'q2', 'q3', 'q4', 'q5')) AS acked;

-- topics: only those topics; an empty list or unknown topics give nothing.
SELECT pg_temp.enq('t1', 'ob.t1', '1');
SELECT pg_temp.enq('t2', 'ob.t2', '2');
SELECT pg_temp.enq('t3', 'ob.t3', '3');
SELECT * FROM pg_temp.claim('relay-a', topics => '{}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nothing,ob}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.t3,ob.t1,ob.t3}');
SELECT * FROM pg_temp.claim('relay-a');
SELECT idempotency.outbox_ack(pg_temp.ids('t1', 't2', 't3')) AS acked;

-- ---------------------------------------------------------------- order per (topic, key)
SELECT pg_temp.enq('e1', 'ob.ord', '{"n": 1}', key => 'k1');
SELECT pg_temp.enq('f1', 'ob.ord', '{"n": 1}', key => 'k2');
SELECT pg_temp.enq('e2', 'ob.ord', '{"n": 2}', key => 'k1');
SELECT pg_temp.enq('n1', 'ob.ord', '{"n": 1}');
SELECT pg_temp.enq('g1', 'ob.ord2', '{"n": 1}', key => 'k1');
SELECT pg_temp.enq('f2', 'ob.ord', '{"n": 2}', key => 'k2');
SELECT pg_temp.enq('e3', 'ob.ord', '{"n": 3}', key => 'k1');
SELECT pg_temp.enq('n2', 'ob.ord', '{"n": 2}');
SELECT pg_temp.enq('g2', 'ob.ord2', '{"n": 2}', key => 'k1');
-- One batch holds the first event of each (topic, key) (k1 of another topic
-- is another key) and every event without a key, not the later ones of a key.
SELECT * FROM pg_temp.claim('relay-a');
-- While they are in flight, nothing more of their keys.
SELECT * FROM pg_temp.claim('relay-b');
-- Once one is delivered, the next one of its key.
SELECT idempotency.outbox_ack(pg_temp.ids('e1', 'g1')) AS acked;
SELECT * FROM pg_temp.claim('relay-b');
-- Waiting to retry holds back the later events of the key ...
SELECT idempotency.outbox_nack(pg_temp.id('e2'), 'busy', retry_in => '0.5s');
SELECT * FROM pg_temp.claim('relay-b');
SELECT pg_sleep(0.6);
-- ... until it is handed out again (attempt 2).
SELECT * FROM pg_temp.claim('relay-b');
-- A dead event holds the later events of its key back, however long, until
-- it is redriven or discarded (outbox_discard deletes it; the next event of
-- its key becomes the head).
SELECT idempotency.outbox_nack(pg_temp.id('e2'), 'bad', false);
SELECT * FROM pg_temp.claim('relay-b');
SELECT idempotency.outbox_discard(pg_temp.ids('e2')) AS discarded;
SELECT * FROM pg_temp.claim('relay-b');
-- retry_in 0: due at once, and still before the next event of the key;
-- attempt grows with each hand-out.
SELECT idempotency.outbox_nack(pg_temp.id('f1'), 'again', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a');
SELECT idempotency.outbox_nack(pg_temp.id('f1'), 'again', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-b');
SELECT idempotency.outbox_ack(pg_temp.ids('f1')) AS acked;
SELECT * FROM pg_temp.claim('relay-b');
-- Events without a key have no order: one waiting to retry holds back nothing.
SELECT idempotency.outbox_nack(pg_temp.id('n1'), 'later', retry_in => '1 hour');
SELECT pg_temp.enq('n3', 'ob.ord', '{"n": 3}');
SELECT * FROM pg_temp.claim('relay-a');
-- An event scheduled for later holds back the later events of its key
-- (enqueue order); a keyed event of another key is not held back.
SELECT pg_temp.enq('h1', 'ob.ord', '{"n": 1}', key => 'k3', deliver_at => clock_timestamp() + interval '0.5s');
SELECT pg_temp.enq('h2', 'ob.ord', '{"n": 2}', key => 'k3');
SELECT pg_temp.enq('j1', 'ob.ord', '{"n": 1}', key => 'k4');
SELECT * FROM pg_temp.claim('relay-a');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-a');
SELECT idempotency.outbox_ack(pg_temp.ids('h1')) AS acked;
SELECT * FROM pg_temp.claim('relay-a');
SELECT * FROM pg_temp.events('ob.ord%');
SELECT idempotency.outbox_ack(pg_temp.ids('e3', 'f2', 'n1', 'n2', 'g2', 'n3', 'h2', 'j1')) AS acked;

-- ---------------------------------------------------------------- ack
SELECT pg_temp.enq('k' || n, 'ob.ack', jsonb_build_object('n', n)) FROM generate_series(1, 5) n;
SELECT * FROM pg_temp.claim('relay-a', 3, topics => '{ob.ack}');
-- The count of events it marked delivered.
SELECT idempotency.outbox_ack(pg_temp.ids('k1', 'k2')) AS acked;
-- Already delivered, unknown ids, an empty array: nothing changes.
SELECT idempotency.outbox_ack(pg_temp.ids('k1', 'k2')) AS acked;
SELECT idempotency.outbox_ack(ARRAY[-1, 0, (SELECT max(id) + 1000 FROM idempotency.outbox)]) AS acked;
SELECT idempotency.outbox_ack('{}') AS acked;
-- Only what is out for delivery counts; an id given twice counts once.
SELECT idempotency.outbox_ack(pg_temp.ids('k1', 'k3', 'k3', 'k4') || (SELECT max(id) + 1000 FROM idempotency.outbox)) AS acked;
-- A pending event never handed out is not delivered by an ack; a dead one stays dead.
SELECT * FROM pg_temp.claim('relay-a', 1, topics => '{ob.ack}');
SELECT idempotency.outbox_nack(pg_temp.id('k4'), 'fatal', false);
SELECT idempotency.outbox_ack(pg_temp.ids('k4', 'k5')) AS acked;
SELECT * FROM pg_temp.events('ob.ack');
SELECT count(*) AS delivered, bool_and(delivered_at = updated_at) AS delivered_at_is_the_ack,
       bool_and(lease_until IS NULL) AS no_lease
  FROM idempotency.outbox WHERE topic = 'ob.ack' AND state = 'delivered';

-- A late ack still marks the event delivered: after its lease ran out
-- (still in flight), after maintenance returned it to pending, while it
-- waits to retry, or after another relay claimed it (whose own ack then
-- changes nothing).
SELECT pg_temp.enq('l' || n, 'ob.late', jsonb_build_object('n', n)) FROM generate_series(1, 5) n;
SELECT * FROM pg_temp.claim('relay-a', lease => '0.5s', topics => '{ob.late}');
SELECT idempotency.outbox_nack(pg_temp.id('l4'), 'later', retry_in => '1 hour');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-b', 1, topics => '{ob.late}');
SELECT * FROM pg_temp.events('ob.late');
SELECT idempotency.outbox_ack(pg_temp.ids('l2')) AS acked_expired_in_flight;
-- A late nack counts too: l5 waits to retry.
SELECT idempotency.outbox_nack(pg_temp.id('l5'), 'late failure', retry_in => '1 hour');
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_outbox_leases';
SELECT * FROM pg_temp.events('ob.late');
SELECT idempotency.outbox_ack(pg_temp.ids('l3')) AS acked_after_maintenance;
SELECT idempotency.outbox_ack(pg_temp.ids('l4')) AS acked_waiting_to_retry;
SELECT idempotency.outbox_ack(pg_temp.ids('l1')) AS acked_by_the_first_relay;
SELECT idempotency.outbox_ack(pg_temp.ids('l1')) AS acked_by_the_second_relay;
SELECT idempotency.outbox_ack(pg_temp.ids('l5')) AS acked_after_a_late_nack;
SELECT * FROM pg_temp.events('ob.late');

-- ---------------------------------------------------------------- nack
-- An unknown id: IK002.
SELECT pg_temp.try($$SELECT idempotency.outbox_nack(-1, 'e')$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_nack((SELECT max(id) + 1000 FROM idempotency.outbox), 'e')$$);
-- An event never handed out: nothing changes, its state is returned.
SELECT pg_temp.enq('m1', 'ob.nack', '{"n": 1}');
SELECT idempotency.outbox_nack(pg_temp.id('m1'), 'not yet', false);
SELECT idempotency.outbox_nack(pg_temp.id('m1'), 'not yet');
SELECT * FROM pg_temp.events('ob.nack');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
-- Retryable without retry_in: back to pending after a backoff from
-- idempotency.retry_base_delay, doubling with each attempt, capped at
-- idempotency.retry_max_delay, drawn from the upper half (jitter).
SET idempotency.retry_base_delay = '10s';
SET idempotency.retry_max_delay = '1h';
SELECT idempotency.outbox_nack(pg_temp.id('m1'), 'first');
SELECT pg_temp.lbl(id) AS event, state, attempts, last_error, lease_until,
       available_at - updated_at BETWEEN interval '5s' AND interval '10s' AS backoff_ok
  FROM idempotency.outbox WHERE id = pg_temp.id('m1');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT pg_temp.enq('m2', 'ob.nack', '{"n": 2}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m2'), 'first', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m2'), 'second');
SELECT pg_temp.lbl(id) AS event, state, attempts, last_error,
       available_at - updated_at BETWEEN interval '10s' AND interval '20s' AS backoff_ok
  FROM idempotency.outbox WHERE id = pg_temp.id('m2');
SELECT pg_temp.enq('m3', 'ob.nack', '{"n": 3}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m3'), 'first', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m3'), 'second', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SET idempotency.retry_max_delay = '15s';
SELECT idempotency.outbox_nack(pg_temp.id('m3'), 'third');
SELECT pg_temp.lbl(id) AS event, state, attempts, last_error,
       available_at - updated_at BETWEEN interval '7.5s' AND interval '15s' AS backoff_ok
  FROM idempotency.outbox WHERE id = pg_temp.id('m3');
RESET idempotency.retry_base_delay;
RESET idempotency.retry_max_delay;
SELECT idempotency.outbox_ack(pg_temp.ids('m1', 'm2', 'm3')) AS acked;
-- retry_in: exactly that long.
SELECT pg_temp.enq('m4', 'ob.nack', '{"n": 4}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m4'), 'in an hour', true, '1 hour');
SELECT pg_temp.lbl(id) AS event, state, attempts, last_error, lease_until,
       available_at - updated_at = interval '1 hour' AS retry_in_ok
  FROM idempotency.outbox WHERE id = pg_temp.id('m4');
SELECT idempotency.outbox_ack(pg_temp.ids('m4')) AS acked;
-- Not retryable: dead (retry_in is ignored).
SELECT pg_temp.enq('m5', 'ob.nack', '{"n": 5}');
SELECT pg_temp.enq('m6', 'ob.nack', '{"n": 6}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m5'), 'rejected', false);
SELECT idempotency.outbox_nack(pg_temp.id('m6'), 'rejected', false, '1 min');
-- A dead or delivered event keeps its state and its last error.
SELECT pg_temp.enq('m7', 'ob.nack', '{"n": 7}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_ack(pg_temp.ids('m7')) AS acked;
SELECT idempotency.outbox_nack(pg_temp.id('m7'), 'too late');
SELECT idempotency.outbox_nack(pg_temp.id('m7'), 'too late', false);
SELECT idempotency.outbox_nack(pg_temp.id('m5'), 'again');
SELECT idempotency.outbox_nack(pg_temp.id('m5'), 'again', false);
-- idempotency.outbox_max_attempts: the nack of the last attempt buries the
-- event even when retryable.
SET idempotency.outbox_max_attempts = 3;
SELECT pg_temp.enq('m8', 'ob.nack', '{"n": 8}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m8'), 'try 1', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m8'), 'try 2', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
SELECT idempotency.outbox_nack(pg_temp.id('m8'), 'try 3', retry_in => '0');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.nack}');
RESET idempotency.outbox_max_attempts;
SELECT * FROM pg_temp.events('ob.nack');
SELECT pg_temp.lbl(id) AS event, topic, key, payload, headers, dedup_key, attempts, last_error,
       died_at >= enqueued_at AS died_after_enqueue
  FROM idempotency.outbox_dead_letters WHERE topic = 'ob.nack' ORDER BY id;

-- ---------------------------------------------------------------- lease expiry
-- An expired lease makes the event claimable again (attempt 2), by any
-- relay; the next event of its key still waits.
SELECT pg_temp.enq('x1', 'ob.lease', '{"n": 1}', key => 'lk');
SELECT pg_temp.enq('x2', 'ob.lease', '{"n": 2}', key => 'lk');
SELECT * FROM pg_temp.claim('relay-a', lease => '0.5s', topics => '{ob.lease}');
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT * FROM pg_temp.events('ob.lease');
SELECT idempotency.outbox_ack(pg_temp.ids('x1')) AS acked;
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT idempotency.outbox_ack(pg_temp.ids('x2')) AS acked;
-- Once its attempts reach idempotency.outbox_max_attempts it is not handed
-- out again (nor are the later events of its key): idem_maintenance()
-- buries it as dead, with last_error 'lease expired', and the dead event
-- still holds y2 back until it is discarded.
SET idempotency.outbox_max_attempts = 2;
SELECT pg_temp.enq('y1', 'ob.lease', '{"n": 1}', key => 'lk2');
SELECT pg_temp.enq('y2', 'ob.lease', '{"n": 2}', key => 'lk2');
SELECT * FROM pg_temp.claim('relay-a', lease => '0.5s', topics => '{ob.lease}');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-a', lease => '0.5s', topics => '{ob.lease}');
SELECT pg_sleep(0.6);
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lease}');
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_outbox_leases';
SELECT * FROM pg_temp.events('ob.lease');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lease}');
SELECT idempotency.outbox_discard(pg_temp.ids('y1')) AS discarded;
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lease}');
RESET idempotency.outbox_max_attempts;
SELECT idempotency.outbox_ack(pg_temp.ids('y2')) AS acked;
-- A dead head holds its key's later events back; redriven, it is handed
-- out again first (its attempts start again at 1), and the next event only
-- after its ack. A key's events that were enqueued after its head died wait
-- behind it too.
SELECT pg_temp.enq('z1', 'ob.lease', '{"n": 1}', key => 'lk3');
SELECT pg_temp.enq('z2', 'ob.lease', '{"n": 2}', key => 'lk3');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lease}');
SELECT idempotency.outbox_nack(pg_temp.id('z1'), 'fatal', false);
SELECT pg_temp.enq('z3', 'ob.lease', '{"n": 3}', key => 'lk3');
SELECT * FROM pg_temp.claim('relay-a', lease => '0.5s', topics => '{ob.lease}');
SELECT idempotency.outbox_redrive(pg_temp.ids('z1')) AS redriven;
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lease}');
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT idempotency.outbox_ack(pg_temp.ids('z1')) AS acked;
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT idempotency.outbox_ack(pg_temp.ids('z2')) AS acked;
SELECT * FROM pg_temp.claim('relay-b', topics => '{ob.lease}');
SELECT idempotency.outbox_ack(pg_temp.ids('z3')) AS acked;
SELECT * FROM pg_temp.events('ob.lease');

-- ---------------------------------------------------------------- redrive
SELECT pg_temp.enq('r1', 'ob.rd1', '{"n": 1}', key => 'rk');
SELECT pg_temp.enq('r2', 'ob.rd1', '{"n": 2}');
SELECT pg_temp.enq('r3', 'ob.rd2', '{"n": 3}');
SELECT pg_temp.enq('r4', 'ob.rd1', '{"n": 4}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.rd1,ob.rd2}');
SELECT idempotency.outbox_nack(pg_temp.id('r1'), 'bad 1', false),
       idempotency.outbox_nack(pg_temp.id('r2'), 'bad 2', false),
       idempotency.outbox_nack(pg_temp.id('r3'), 'bad 3', false);
-- By id: dead -> pending with its attempts reset to 0 (its last error kept),
-- due at once; handed out again with attempt 1.
SELECT idempotency.outbox_redrive(pg_temp.ids('r1')) AS redriven;
SELECT * FROM pg_temp.events('ob.rd%');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.rd1,ob.rd2}');
-- Only dead events: in flight, delivered, unknown ids or an empty list: 0.
SELECT idempotency.outbox_redrive(pg_temp.ids('r1', 'r4') || ARRAY[-1::bigint]) AS redriven;
SELECT idempotency.outbox_redrive('{}') AS redriven;
SELECT idempotency.outbox_ack(pg_temp.ids('r4')) AS acked;
SELECT idempotency.outbox_redrive(pg_temp.ids('r4')) AS redriven;
-- By topic; with ids and topic, events that match both.
SELECT idempotency.outbox_redrive(topic => 'ob.nothing') AS redriven;
SELECT idempotency.outbox_redrive(topic => 'ob.rd2') AS redriven;
SELECT idempotency.outbox_redrive(pg_temp.ids('r2'), 'ob.rd2') AS redriven;
SELECT idempotency.outbox_redrive(pg_temp.ids('r2'), 'ob.rd1') AS redriven;
SELECT * FROM pg_temp.events('ob.rd%');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.rd1,ob.rd2}');
SELECT idempotency.outbox_ack(pg_temp.ids('r1', 'r2', 'r3')) AS acked;
-- Both NULL: every dead event, of every topic.
SELECT pg_temp.lbl(id) AS event, topic, attempts, last_error FROM idempotency.outbox_dead_letters ORDER BY id;
SELECT idempotency.outbox_redrive() AS redriven;
SELECT count(*) AS dead_letters FROM idempotency.outbox_dead_letters;
SELECT * FROM pg_temp.claim('relay-a');
SELECT idempotency.outbox_ack(array_agg(id)) AS acked FROM idempotency.outbox WHERE state = 'in_flight';
SELECT idempotency.outbox_redrive() AS redriven;
SELECT state, count(*) FROM idempotency.outbox GROUP BY state ORDER BY state;

-- ---------------------------------------------------------------- outbox_lag, outbox_dead_letters
-- Topic ob.lag has an event in every state; each undelivered event that is
-- not dead counts in exactly one of pending (never failed, including later
-- deliveries and redriven events), in_flight (lease alive) and retrying
-- (failed at least once, or its lease ran out). The lag counts from when
-- the event that has waited longest to be handed out became due: here
-- v-redriven, redriven before v-expired's lease ran out and v-pending was
-- enqueued; v-retry (backing off), v-fly (in flight) and v-later
-- (scheduled) are not due.
SELECT pg_temp.enq('v-done', 'ob.lag', '{"n": 1}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT idempotency.outbox_ack(pg_temp.ids('v-done')) AS acked;
SELECT pg_temp.enq('v-dead', 'ob.lag', '{"n": 2}', key => 'vk', headers => '{"h": 1}', dedup_key => 'vd');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT idempotency.outbox_nack(pg_temp.id('v-dead'), 'no such recipient', false);
SELECT pg_temp.enq('v-retry', 'ob.lag', '{"n": 3}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT idempotency.outbox_nack(pg_temp.id('v-retry'), 'busy', retry_in => '1 hour');
SELECT pg_temp.enq('v-fly', 'ob.lag', '{"n": 4}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT pg_temp.enq('v-redriven', 'ob.lag', '{"n": 5}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT idempotency.outbox_nack(pg_temp.id('v-redriven'), 'rejected', false);
SELECT pg_temp.enq('v-expired', 'ob.lag', '{"n": 6}');
SELECT * FROM pg_temp.claim('relay-a', lease => '0.2s', topics => '{ob.lag}');
SELECT idempotency.outbox_redrive(pg_temp.ids('v-redriven')) AS redriven;
SELECT pg_temp.enq('v-pending', 'ob.lag', '{"n": 7}');
SELECT pg_temp.enq('v-later', 'ob.lag', '{"n": 8}', deliver_at => clock_timestamp() + interval '1 hour');
-- Topic ob.lag2: everything delivered or dead; topic ob.lag3: only dead.
SELECT pg_temp.enq('w-done', 'ob.lag2', '{"n": 1}');
SELECT pg_temp.enq('w-dead', 'ob.lag2', '{"n": 2}');
SELECT pg_temp.enq('u-dead', 'ob.lag3', '{"n": 1}');
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag2,ob.lag3}');
SELECT idempotency.outbox_ack(pg_temp.ids('w-done')) AS acked;
SELECT idempotency.outbox_nack(pg_temp.id('w-dead'), 'gone', false),
       idempotency.outbox_nack(pg_temp.id('u-dead'), 'gone', false);
SELECT pg_sleep(0.3);
SELECT * FROM pg_temp.events('ob.lag%');
SELECT clock_timestamp() AS t0 \gset
CREATE TEMP TABLE lag_now AS SELECT * FROM idempotency.outbox_lag WHERE topic LIKE 'ob.lag%';
SELECT clock_timestamp() AS t1 \gset
SELECT l.topic, l.pending, l.in_flight, l.retrying, l.dead,
       l.pending + l.in_flight + l.retrying = (SELECT count(*) FROM idempotency.outbox o
                                                WHERE o.topic = l.topic AND o.state IN ('pending', 'in_flight'))
           AS each_counted_once,
       l.oldest_pending_at = (SELECT min(o.ready_at) FROM idempotency.outbox o
                               WHERE o.topic = l.topic AND o.ready_at <= :'t1')
           AS oldest_pending_at_ok,
       l.oldest_pending_at = (SELECT o.updated_at FROM idempotency.outbox o WHERE o.id = pg_temp.id('v-redriven'))
           AS oldest_is_v_redriven,
       l.lag BETWEEN :'t0'::timestamptz - l.oldest_pending_at AND :'t1'::timestamptz - l.oldest_pending_at AS lag_ok,
       l.lag > '0' AS lagging, l.lag = '0' AS no_lag,
       l.last_delivered_at = (SELECT max(o.delivered_at) FROM idempotency.outbox o WHERE o.topic = l.topic)
           AS last_delivered_at_ok,
       l.last_delivered_at IS NULL AS never_delivered
  FROM lag_now l ORDER BY l.topic;
DROP TABLE lag_now;
-- Expired leases returned to pending by maintenance stay retrying. Once
-- only v-later (due in an hour) is undelivered, nothing is late: a
-- scheduled event has no lag before it is due.
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_outbox_leases';
SELECT topic, pending, in_flight, retrying, dead FROM idempotency.outbox_lag WHERE topic LIKE 'ob.lag%' ORDER BY topic;
SELECT * FROM pg_temp.claim('relay-a', topics => '{ob.lag}');
SELECT idempotency.outbox_ack(array_agg(id)) AS acked
  FROM idempotency.outbox WHERE topic = 'ob.lag' AND state IN ('in_flight', 'pending');
SELECT topic, pending, in_flight, retrying, dead,
       pending = 1 AND (SELECT o.state FROM idempotency.outbox o WHERE o.id = pg_temp.id('v-later')) = 'pending'
           AS v_later_pending,
       oldest_pending_at IS NULL AS nothing_due, lag > '0' AS lagging, lag = '0' AS no_lag,
       last_delivered_at = (SELECT max(o.delivered_at) FROM idempotency.outbox o WHERE o.topic = l.topic)
           AS last_delivered_at_ok
  FROM idempotency.outbox_lag l WHERE topic LIKE 'ob.lag%' ORDER BY topic;
-- A deduplicated enqueue returns the first event's id, whatever its state.
SELECT pg_temp.enq('a2-delivered', 'ob.a', '{"n": 100}', dedup_key => 'd1');
SELECT pg_temp.enq('v-dead-again', 'ob.lag', '{"n": 100}', dedup_key => 'vd');
-- The dead letters: dead events with their last error and attempts.
SELECT pg_temp.lbl(id) AS event, topic, key, payload, headers, dedup_key, attempts, last_error,
       died_at >= enqueued_at AS died_after_enqueue,
       died_at = (SELECT o.updated_at FROM idempotency.outbox o WHERE o.id = d.id) AS died_at_ok
  FROM idempotency.outbox_dead_letters d WHERE topic LIKE 'ob.lag%' ORDER BY id;
-- Every topic of the database.
SELECT topic, pending, in_flight, retrying, dead, lag = '0' AS no_lag, last_delivered_at IS NOT NULL AS delivered_some
  FROM idempotency.outbox_lag ORDER BY topic COLLATE "C";

-- ---------------------------------------------------------------- notifications
-- On commit of the enqueuing transaction, listeners of channel
-- idempotency_outbox are notified with the topic as payload; not before
-- the commit, not after a rollback, not for a deduplicated enqueue.
-- PostgreSQL folds identical notifications of one transaction into one.
-- psql prints notifications with the sender's PID: they are written to a
-- file and read back with this session's PID masked.
\getenv abs_builddir PG_ABS_BUILDDIR
\set notify_file :abs_builddir '/results/outbox_notifications.txt'
LISTEN idempotency_outbox;
\o :notify_file
\qecho 1. one enqueue, autocommit
SELECT idempotency.outbox_enqueue('ob.n1', '{}') IS NOT NULL AS enqueued \gset
\qecho 2. a transaction: three enqueues in two topics
BEGIN;
SELECT idempotency.outbox_enqueue('ob.n2', '{}') IS NOT NULL AS enqueued \gset
SELECT idempotency.outbox_enqueue('ob.n3', '{}') IS NOT NULL AS enqueued \gset
SELECT idempotency.outbox_enqueue('ob.n2', '{}') IS NOT NULL AS enqueued \gset
\qecho 2. before commit
COMMIT;
\qecho 3. a transaction that rolls back
BEGIN;
SELECT idempotency.outbox_enqueue('ob.n4', '{}') IS NOT NULL AS enqueued \gset
ROLLBACK;
\qecho 4. an enqueue with a new dedup_key
SELECT idempotency.outbox_enqueue('ob.n5', '{}', dedup_key => 'nd') IS NOT NULL AS enqueued \gset
\qecho 5. the same dedup_key again
SELECT idempotency.outbox_enqueue('ob.n5', '{}', dedup_key => 'nd') IS NOT NULL AS enqueued \gset
\qecho 6. a savepoint that rolls back
BEGIN;
SELECT idempotency.outbox_enqueue('ob.n6', '{}') IS NOT NULL AS enqueued \gset
SAVEPOINT s;
SELECT idempotency.outbox_enqueue('ob.n7', '{}') IS NOT NULL AS enqueued \gset
ROLLBACK TO SAVEPOINT s;
COMMIT;
\qecho 7. claim, nack, redrive and ack notify nothing
SELECT array_agg(c.id ORDER BY c.id) AS claimed
  FROM idempotency.outbox_claim('relay-a', topics => '{ob.n1,ob.n2,ob.n3,ob.n5,ob.n6}') c \gset
SELECT idempotency.outbox_nack((:'claimed'::bigint[])[1], 'e', false) AS nacked \gset
SELECT idempotency.outbox_redrive((:'claimed'::bigint[])[1:1]) AS redriven \gset
SELECT count(*) AS reclaimed FROM idempotency.outbox_claim('relay-a', topics => '{ob.n1}') \gset
SELECT idempotency.outbox_ack(:'claimed'::bigint[]) AS acked \gset
\qecho 8. a topic with characters that need quoting
SELECT idempotency.outbox_enqueue('ob.n"8'' x', '{}') IS NOT NULL AS enqueued \gset
\qecho 9. idempotency.outbox_notify off: the event, no notification
SET idempotency.outbox_notify = off;
SELECT idempotency.outbox_enqueue('ob.n9', '{}') IS NOT NULL AS enqueued \gset
RESET idempotency.outbox_notify;
\qecho end
\o
UNLISTEN idempotency_outbox;
SELECT :'nacked' AS nacked, :redriven AS redriven, :reclaimed AS reclaimed, :acked AS acked;
SELECT n, replace(line, pg_backend_pid()::text, '<this session>') AS line
  FROM regexp_split_to_table(rtrim(pg_read_file(:'notify_file'), E'\n'), E'\n') WITH ORDINALITY AS l(line, n)
 ORDER BY n;
SELECT topic, count(*) AS events, count(*) FILTER (WHERE state = 'delivered') AS delivered
  FROM idempotency.outbox WHERE topic ~ '^ob\.n[0-9"]' GROUP BY topic ORDER BY topic COLLATE "C";

-- ---------------------------------------------------------------- idem_maintenance
-- expire_outbox_leases returns expired in-flight events to pending (or
-- buries them when their attempts reached the idempotency.outbox_max_attempts
-- their claim recorded); purge_outbox deletes delivered events older
-- than idempotency.outbox_retention (server-wide), in batches of
-- idempotency.purge_batch. A database of its own, so that counts are exact.
\c contrib_regression
DROP DATABASE idem_outbox;
CREATE DATABASE idem_outbox_maint;
\c idem_outbox_maint
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE TEMP TABLE ev (label text PRIMARY KEY, id bigint NOT NULL UNIQUE);
CREATE FUNCTION pg_temp.lbl(i bigint) RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce((SELECT label FROM ev WHERE id = i), 'unknown') $f$;
CREATE FUNCTION pg_temp.id(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT id FROM ev WHERE label = l $f$;
-- Nothing to do.
SELECT * FROM idempotency.idem_maintenance();
INSERT INTO ev SELECT 'exhausted', idempotency.outbox_enqueue('om', '{}');
INSERT INTO ev SELECT 'expires-' || n, idempotency.outbox_enqueue('om', jsonb_build_object('n', n)) FROM generate_series(1, 2) n;
INSERT INTO ev SELECT 'live', idempotency.outbox_enqueue('om.live', '{}');
INSERT INTO ev SELECT 'done-' || n, idempotency.outbox_enqueue('om.done', jsonb_build_object('n', n)) FROM generate_series(1, 3) n;
INSERT INTO ev SELECT 'dead', idempotency.outbox_enqueue('om.done', '{}');
INSERT INTO ev SELECT 'pending', idempotency.outbox_enqueue('om.pending', '{}');
SELECT pg_temp.lbl(id) AS event, attempt FROM idempotency.outbox_claim('relay', 10, '1 min', '{om.live}');
SELECT pg_temp.lbl(id) AS event, attempt FROM idempotency.outbox_claim('relay', 1, '1 min', '{om}');
SELECT idempotency.outbox_nack(pg_temp.id('exhausted'), 'e', retry_in => '0');
-- The claim records its session's attempt cap, which the sweep honours.
SET idempotency.outbox_max_attempts = 2;
SELECT pg_temp.lbl(id) AS event, attempt FROM idempotency.outbox_claim('relay', 3, '0.2s', '{om}');
RESET idempotency.outbox_max_attempts;
SELECT count(*) AS claimed FROM idempotency.outbox_claim('relay', 10, '1 min', '{om.done}');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id('done-1'), pg_temp.id('done-2'), pg_temp.id('done-3')]) AS acked;
SELECT idempotency.outbox_nack(pg_temp.id('dead'), 'fatal', false);
SELECT pg_sleep(0.3);
-- The cap its claim recorded, not the sweep's own: 'exhausted' has used 2 of 2.
SELECT * FROM idempotency.idem_maintenance();
SELECT pg_temp.lbl(id) AS event, topic, state, attempts, last_error, lease_until IS NULL AS no_lease,
       CASE WHEN state = 'pending' THEN available_at <= clock_timestamp() END AS due
  FROM idempotency.outbox ORDER BY id;
SELECT pg_temp.lbl(id) AS event, attempts, last_error FROM idempotency.outbox_dead_letters ORDER BY id;
-- A late nack of an event the sweep returned to pending (not in flight any
-- more) changes nothing: not its error, not when it is due.
SELECT available_at AS was_due FROM idempotency.outbox WHERE id = pg_temp.id('expires-1') \gset
SELECT idempotency.outbox_nack(pg_temp.id('expires-1'), 'late nack', retry_in => '1 hour') AS state;
SELECT state, attempts, last_error, available_at = :'was_due' AS same_due
  FROM idempotency.outbox WHERE id = pg_temp.id('expires-1');
-- Returned to pending: claimable at once, with the next attempt.
SELECT pg_temp.lbl(id) AS event, attempt FROM idempotency.outbox_claim('relay', 10, '1 min', '{om}');
-- A second sweep finds nothing (delivered events are kept idempotency.outbox_retention).
SHOW idempotency.outbox_retention;
SELECT * FROM idempotency.idem_maintenance();

-- Retention: delivered events older than idempotency.outbox_retention are
-- deleted, in batches of idempotency.purge_batch; newer ones, dead and
-- pending events are kept.
ALTER SYSTEM SET idempotency.outbox_retention = '1s';
ALTER SYSTEM SET idempotency.purge_batch = 2;
SELECT pg_reload_conf();
SELECT idempotency.outbox_ack(array_agg(id)) AS acked FROM idempotency.outbox WHERE state = 'in_flight';
SELECT pg_sleep(1.1);
SHOW idempotency.outbox_retention;
SHOW idempotency.purge_batch;
INSERT INTO ev SELECT 'done-recent', idempotency.outbox_enqueue('om.done', '{}');
SELECT count(*) AS claimed FROM idempotency.outbox_claim('relay', 10, '1 min', '{om.done}');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id('done-recent')]) AS acked;
SELECT * FROM idempotency.idem_maintenance();
SELECT pg_temp.lbl(id) AS event, topic, state FROM idempotency.outbox ORDER BY id;
ALTER SYSTEM RESET idempotency.outbox_retention;
ALTER SYSTEM RESET idempotency.purge_batch;
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SHOW idempotency.outbox_retention;
SHOW idempotency.purge_batch;
\c contrib_regression
DROP DATABASE idem_outbox_maint;
