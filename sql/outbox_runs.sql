-- Runs: with idempotency.outbox_run_length above 1, a claim hands out a
-- keyed head together with the events waiting behind it in its key's
-- order (its run), so that a key with a backlog drains a batch at a time.
-- The events after the head stay behind it (no ready place of their own):
-- no other claim hands them out, acking the run lets the key go on, and a
-- nack, release or expired lease of the head leaves the rest waiting in
-- their order. A database of its own: the ids are the events' numbers.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_runs;
\c idem_outbox_runs
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;

-- Each event: its state, attempts, and whether it is its key's head (a
-- ready place), ready again when its lease ends (in flight).
CREATE FUNCTION pg_temp.events(OUT id bigint, OUT key text, OUT state text, OUT attempts int,
                               OUT head boolean, OUT ready_at_lease_end boolean)
RETURNS SETOF record LANGUAGE sql AS $f$
    SELECT id, key, state::text, attempts, ready_at IS NOT NULL,
           CASE WHEN state = 'in_flight' AND ready_at IS NOT NULL THEN ready_at = lease_until END
      FROM idempotency.outbox ORDER BY id $f$;
-- Keys with more than one head: never any.
CREATE FUNCTION pg_temp.keys_with_two_heads() RETURNS bigint LANGUAGE sql AS $f$
    SELECT count(*) FROM (SELECT topic, key FROM idempotency.outbox
                           WHERE key IS NOT NULL AND ready_at IS NOT NULL
                           GROUP BY topic, key HAVING count(*) > 1) k $f$;

-- The setting: 1 by default (the head alone), from 1 to 10000.
SHOW idempotency.outbox_run_length;
SET idempotency.outbox_run_length = 0;
SET idempotency.outbox_run_length = 10001;
SET idempotency.outbox_run_length = 'many';

-- Events 1-5 of key k, 6-7 of key j, 8 without a key.
SELECT count(idempotency.outbox_enqueue('t', jsonb_build_object('n', i), key => 'k'))
  FROM generate_series(1, 5) i;
SELECT count(idempotency.outbox_enqueue('t', jsonb_build_object('n', i), key => 'j'))
  FROM generate_series(1, 2) i;
SELECT idempotency.outbox_enqueue('t', '{"n": 1}');

-- With the default, one event per key.
BEGIN;
SELECT id, key FROM idempotency.outbox_claim('r0', batch => 10);
ROLLBACK;

-- A run of 3: the heads first (as many keys as the batch takes), then in
-- the room left the events behind each head, in key order; runs count
-- toward the batch.
SET idempotency.outbox_run_length = 3;
BEGIN;
SELECT id, key FROM idempotency.outbox_claim('r0', batch => 4);
ROLLBACK;
SELECT id, key, payload, attempt FROM idempotency.outbox_claim('r1', batch => 10, lease => '1 hour');
SELECT * FROM pg_temp.events();
-- Another relay gets nothing of these keys: the runs are out.
SELECT id FROM idempotency.outbox_claim('r2', batch => 10);
-- outbox_lag counts the run in flight.
SELECT pending, in_flight, retrying FROM idempotency.outbox_lag WHERE topic = 't';

-- A follower acked before its head ends nothing: the head stays the
-- key's only head.
SELECT idempotency.outbox_ack('{7}');
SELECT pg_temp.keys_with_two_heads();
SELECT id FROM idempotency.outbox_claim('r2', batch => 10);
-- Acking the head and the next event: the third, still in flight, becomes
-- the head, ready again when its lease ends.
SELECT idempotency.outbox_ack('{1,2,6,8}');
SELECT * FROM pg_temp.events();
SELECT id FROM idempotency.outbox_claim('r2', batch => 10);

-- A nack of the head (retryable, no delay) after the run failed there:
-- the rest of the run is released and waits behind it, its attempt given
-- back; the next claim hands out the run again, from the head.
SELECT idempotency.outbox_nack(3, 'HTTP 503', retryable => true, retry_in => '0s');
SELECT * FROM pg_temp.events() WHERE key = 'k';
SELECT id, attempt FROM idempotency.outbox_claim('r2', batch => 10, lease => '1 hour');
SELECT idempotency.outbox_nack(3, 'HTTP 503', retryable => true, retry_in => '0s');
SELECT idempotency.outbox_release('{4,5}', 'r2');
SELECT * FROM pg_temp.events() WHERE key = 'k';

-- Claimed and acked in one transaction: the claims of the events after
-- the acked head are written at commit, the next one as the head.
BEGIN;
SELECT id, attempt FROM idempotency.outbox_claim('r3', batch => 10, lease => '1 hour');
SELECT idempotency.outbox_ack('{3}');
COMMIT;
SELECT * FROM pg_temp.events() WHERE key = 'k';
SELECT pg_temp.keys_with_two_heads();
SELECT idempotency.outbox_ack('{4,5}');

-- A follower that is not due (deliver_at later) ends the run.
SELECT idempotency.outbox_enqueue('t', '{"n": 6}', key => 'k');
SELECT idempotency.outbox_enqueue('t', '{"n": 7}', key => 'k', deliver_at => now() + interval '1 hour');
SELECT idempotency.outbox_enqueue('t', '{"n": 8}', key => 'k');
SELECT id FROM idempotency.outbox_claim('r4', batch => 10, lease => '1 hour');
SELECT idempotency.outbox_ack('{9}');
SELECT id FROM idempotency.outbox_claim('r4', batch => 10);
SELECT id, key, state FROM idempotency.outbox WHERE id >= 9 ORDER BY id;
DELETE FROM idempotency.outbox;

-- The relay died: the leases of a run run out. Before the sweep, the next
-- claim hands out the run again; after it, the head is pending, the
-- events behind it wait, and the next claim hands the run out again.
SELECT count(idempotency.outbox_enqueue('t2', jsonb_build_object('n', i), key => 'x'))
  FROM generate_series(1, 4) i;
SELECT id, attempt FROM idempotency.outbox_claim('r5', batch => 10, lease => '0.5s');
SELECT pg_sleep(0.6);
SELECT id, attempt FROM idempotency.outbox_claim('r6', batch => 3, lease => '0.5s');
SELECT pg_sleep(0.6);
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_outbox_leases';
SELECT id, state, attempts, ready_at IS NOT NULL AS head FROM idempotency.outbox ORDER BY id;
SELECT id, attempt FROM idempotency.outbox_claim('r7', batch => 10, lease => '1 hour');
SELECT pg_temp.keys_with_two_heads();

\c contrib_regression
DROP DATABASE idem_outbox_runs;
