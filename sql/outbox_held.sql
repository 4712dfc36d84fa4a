-- outbox_claim holds the events it hands out by their row lock; what a
-- claim writes (in flight, one more attempt, the lease, the relay) is
-- written when the transaction commits or is prepared, unless the same
-- transaction acked or nacked the event first, which then writes the
-- claim's changes with its own. Savepoints rolled back take back what they
-- did. Runs in a database of its own so that claims over every topic are
-- exact.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_held;
\c idem_outbox_held
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- enq(n, key): an event whose payload is {"n": n}.
CREATE FUNCTION pg_temp.enq(n int, key text DEFAULT NULL) RETURNS void LANGUAGE sql AS $f$
    SELECT idempotency.outbox_enqueue('held', jsonb_build_object('n', n), key) $f$;
-- claim(relay, batch): the events handed out, as "n@attempt", in id order.
CREATE FUNCTION pg_temp.claim(relay text, batch int DEFAULT 100) RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce(string_agg((payload->>'n') || '@' || attempt, ' ' ORDER BY id), 'none')
      FROM idempotency.outbox_claim(relay, batch, '1 hour') $f$;
-- id(n): the id of event n.
CREATE FUNCTION pg_temp.id(n int) RETURNS bigint LANGUAGE sql AS $f$
    SELECT id FROM idempotency.outbox WHERE payload->>'n' = n::text $f$;
-- events(): every event as stored: leased means a lease that has not run out.
CREATE FUNCTION pg_temp.events()
RETURNS TABLE (n text, key text, state idempotency.outbox_state, attempts int, relay text,
               leased boolean, last_error text, delivered boolean)
LANGUAGE sql AS $f$
    SELECT payload->>'n', key, state, attempts, relay, lease_until > clock_timestamp(),
           last_error, delivered_at IS NOT NULL
      FROM idempotency.outbox ORDER BY id $f$;
-- written(): row versions updated in the outbox by this backend, counted
-- from the transaction's start and since earlier transactions whose counts
-- are not yet reported (so the tests print differences).
CREATE FUNCTION pg_temp.written() RETURNS bigint LANGUAGE sql AS $f$
    SELECT pg_stat_get_xact_tuples_updated('idempotency.outbox'::regclass) $f$;
-- fresh(): an empty outbox with events 1 (key a), 2 (key a), 3 (key b), 4 (no key).
CREATE FUNCTION pg_temp.fresh() RETURNS void LANGUAGE sql AS $f$
    TRUNCATE idempotency.outbox;
    SELECT pg_temp.enq(1, 'a');
    SELECT pg_temp.enq(2, 'a');
    SELECT pg_temp.enq(3, 'b');
    SELECT pg_temp.enq(4) $f$;

-- Claimed and acked in one transaction: each event is written once, as
-- delivered, with the claim's attempt and relay (the next event of key a
-- becomes its key's head at the commit, one more write then). Until then
-- the claiming transaction itself sees them pending (other sessions see
-- them locked).
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.written() AS before \gset
SELECT pg_temp.claim('r1');
SELECT pg_temp.written() - :before AS written_by_claim;
SELECT n, state, attempts FROM pg_temp.events();
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1), pg_temp.id(3), pg_temp.id(4)]) AS acked;
SELECT pg_temp.written() - :before AS written_by_claim_and_ack;
COMMIT;
SELECT * FROM pg_temp.events();

-- Two relays' claims in one transaction, acked by one call: each event is
-- written once, delivered, with the relay that claimed it.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.written() AS before \gset
SELECT pg_temp.claim('r1', 1);
SELECT pg_temp.claim('r2', 2);
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1), pg_temp.id(3), pg_temp.id(4)]) AS acked;
SELECT pg_temp.written() - :before AS written_by_claims_and_ack;
COMMIT;
SELECT * FROM pg_temp.events();

-- Claimed and committed: the claim is written then, in flight with its lease.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1');
COMMIT;
SELECT * FROM pg_temp.events();
-- ... and the same in autocommit.
SELECT pg_temp.fresh();
SELECT pg_temp.claim('r1', 1);
SELECT * FROM pg_temp.events();

-- Rolled back: nothing was handed out as far as the table knows.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1');
ROLLBACK;
SELECT * FROM pg_temp.events();

-- Claimed and nacked in one transaction: the nack counts the claim's attempt.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.written() AS before \gset
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_nack(pg_temp.id(1), 'busy', retry_in => '1 hour') AS state;
SELECT idempotency.outbox_nack(pg_temp.id(3), 'bad', retryable => false) AS state;
SELECT pg_temp.written() - :before AS written_by_claim_and_nacks;
COMMIT;
SELECT * FROM pg_temp.events();
-- ... so with outbox_max_attempts = 1 the first nack is final.
SELECT pg_temp.fresh();
SET idempotency.outbox_max_attempts = 1;
BEGIN;
SELECT pg_temp.claim('r1', 1);
SELECT idempotency.outbox_nack(pg_temp.id(1), 'busy') AS state;
COMMIT;
RESET idempotency.outbox_max_attempts;
SELECT n, state, attempts, last_error FROM pg_temp.events() WHERE n = '1';
-- The claim's cap (the claiming session's outbox_max_attempts) is written
-- by the ack or nack that settles a held event, as by a claim committed
-- alone; the nack decides by it.
SELECT pg_temp.fresh();
SET idempotency.outbox_max_attempts = 7;
BEGIN;
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
SELECT idempotency.outbox_nack(pg_temp.id(3), 'busy', retry_in => '1 hour') AS state;
SELECT idempotency.outbox_nack(pg_temp.id(4), 'bad', retryable => false) AS state;
COMMIT;
RESET idempotency.outbox_max_attempts;
SELECT payload->>'n' AS n, state, attempts, max_attempts FROM idempotency.outbox ORDER BY id;
-- Nacked with no delay: handed out again in the same transaction, attempt 2
-- (behind the events that were ready before its retry: oldest ready first).
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1', 1);
SELECT idempotency.outbox_nack(pg_temp.id(1), 'again', retry_in => '0') AS state;
SELECT pg_temp.claim('r2');
COMMIT;
SELECT n, state, attempts, relay, leased, last_error FROM pg_temp.events() WHERE n = '1';

-- A transaction's second claim: nothing it already holds, and nothing of
-- their keys until they are acked.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1', 1);
SELECT pg_temp.claim('r1');
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
SELECT pg_temp.claim('r1');
COMMIT;
SELECT * FROM pg_temp.events();
-- An ack of an id twice, of held and not held events at once.
SELECT pg_temp.fresh();
SELECT pg_temp.claim('r1', 1);
BEGIN;
SELECT pg_temp.claim('r2');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1), pg_temp.id(3), pg_temp.id(3), pg_temp.id(2)]) AS acked;
COMMIT;
SELECT * FROM pg_temp.events();

-- Savepoints. An ack rolled back: the claim is written at commit.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1', 1);
SAVEPOINT s;
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT n, state, attempts, relay, leased, delivered FROM pg_temp.events() WHERE n = '1';
-- A nack rolled back, then an ack.
SELECT pg_temp.fresh();
BEGIN;
SELECT pg_temp.claim('r1', 1);
SAVEPOINT s;
SELECT idempotency.outbox_nack(pg_temp.id(1), 'busy') AS state;
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
COMMIT;
SELECT n, state, attempts, relay, last_error, delivered FROM pg_temp.events() WHERE n = '1';
-- A claim rolled back: its events are free again, in this transaction too.
SELECT pg_temp.fresh();
BEGIN;
SAVEPOINT s;
SELECT pg_temp.claim('r1');
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.claim('r2', 2);
COMMIT;
SELECT * FROM pg_temp.events();
-- A claim in a savepoint released, then acked in another one released.
SELECT pg_temp.fresh();
BEGIN;
SAVEPOINT s1;
SELECT pg_temp.claim('r1', 2);
RELEASE SAVEPOINT s1;
SAVEPOINT s2;
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
RELEASE SAVEPOINT s2;
COMMIT;
SELECT * FROM pg_temp.events();
-- An error in a subtransaction (a PL/pgSQL exception block) after a claim
-- inside it: the claim goes with it.
SELECT pg_temp.fresh();
DO $$
BEGIN
    BEGIN
        PERFORM pg_temp.claim('r1');
        RAISE EXCEPTION 'relay failed';
    EXCEPTION WHEN raise_exception THEN
        RAISE NOTICE 'caught: %', SQLERRM;
    END;
END $$;
SELECT * FROM pg_temp.events();

-- A dead head holds its key back: nothing to claim. Redriven in the
-- claiming transaction, it is handed out first, and its next event only
-- once it is acked.
TRUNCATE idempotency.outbox;
SELECT pg_temp.enq(1, 'a');
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_nack(pg_temp.id(1), 'bad', retryable => false) AS state;
SELECT pg_temp.enq(2, 'a');
BEGIN;
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_redrive(ARRAY[pg_temp.id(1)]) AS redriven;
SELECT pg_temp.claim('r1');
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
SELECT pg_temp.claim('r1');
COMMIT;
SELECT * FROM pg_temp.events();

-- PREPARE TRANSACTION writes the claims; they count once it commits.
SELECT pg_temp.fresh();
BEGIN;
SET LOCAL idempotency.outbox_notify = off;
SELECT pg_temp.claim('r1', 2);
SELECT idempotency.outbox_ack(ARRAY[pg_temp.id(1)]) AS acked;
PREPARE TRANSACTION 'idem_held';
SELECT n, state, attempts FROM pg_temp.events();
COMMIT PREPARED 'idem_held';
SELECT * FROM pg_temp.events();

-- A relay role with no privilege on the table: the claims are written at
-- commit as the functions' owner.
SELECT pg_temp.fresh();
CREATE ROLE regress_idem_held_app;
SELECT idempotency.grant_relay('regress_idem_held_app');
SET ROLE regress_idem_held_app;
BEGIN;
SELECT count(*) AS claimed FROM idempotency.outbox_claim('app', 2);
COMMIT;
RESET ROLE;
SELECT * FROM pg_temp.events();
SELECT idempotency.revoke_role('regress_idem_held_app');
DROP ROLE regress_idem_held_app;

\c contrib_regression
DROP DATABASE idem_outbox_held;
