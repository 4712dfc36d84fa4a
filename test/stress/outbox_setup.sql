-- Outbox stress test schema: the extension, the producers' and relays' logs,
-- the receiver (the "sink" the relays deliver to) and the two procedures
-- pgbench calls. Every log row is written in the same transaction as the call
-- it records, so the logs hold exactly what committed; the one exception is
-- rolled_back, written after the rollback it records.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE EXTENSION idempotency;

-- Every payload gets a number from this sequence (not transactional: numbers
-- of rolled-back enqueues are never reused).
CREATE SEQUENCE payload_seq;
CREATE SEQUENCE claim_seq;

-- What producers enqueued and committed: one row per outbox_enqueue call,
-- in the enqueuing transaction. With a dedup_key already taken, event_id is
-- the existing event's id and the event's payload carries the other pid.
CREATE TABLE produced (
    pid bigint PRIMARY KEY, event_id bigint NOT NULL, topic text NOT NULL, key text,
    dedup_key text, client int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
-- What producers enqueued and then rolled back (written after the rollback).
CREATE TABLE rolled_back (pid bigint PRIMARY KEY, client int NOT NULL);

-- Every event a claim handed out (claim transaction), with the lease it got
-- once the claim committed, and the time right after the claim returned
-- (the latest it can have been made; the lease, when there is one, tells
-- exactly). A claim acked or nacked in its own transaction has no lease.
CREATE TABLE claim_log (
    cno bigint NOT NULL, event_id bigint NOT NULL, topic text NOT NULL, key text,
    pid bigint NOT NULL, attempt int NOT NULL, relay int NOT NULL, lease_ms int NOT NULL,
    lease_until timestamptz, returned_at timestamptz NOT NULL, fate text NOT NULL);
CREATE INDEX ON claim_log (cno);
CREATE INDEX ON claim_log (event_id, attempt);
-- Every nack (its transaction) and every ack with what it returned.
CREATE TABLE nack_log (cno bigint NOT NULL, event_id bigint NOT NULL, attempt int NOT NULL,
                       state text NOT NULL);
CREATE TABLE ack_log (cno bigint NOT NULL, ids bigint[] NOT NULL, changed bigint NOT NULL,
                      late boolean NOT NULL);

-- The receiver: one row per delivery, in delivery order (seq). No unique
-- constraint: at-least-once duplicates must show.
CREATE TABLE receiver (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id bigint NOT NULL,
    topic text NOT NULL, key text, pid bigint NOT NULL, attempt int NOT NULL,
    cno bigint NOT NULL, relay int NOT NULL);
CREATE INDEX ON receiver (event_id);

-- One producer transaction: 1-3 events of random (topic, key) (about one in
-- five without a key), in random order (producers of a key never wait for
-- each other, so crossing orders must not deadlock), and in one transaction
-- in ten a last event without a key whose dedup_key comes from a small
-- pool; held open for p_hold_ms while the relays run, then committed or
-- rolled back. (An enqueue of a dedup_key waits for another open transaction
-- that enqueued the same one; one per transaction keeps that free of
-- deadlocks.)
CREATE PROCEDURE produce(p_client int, p_events int, p_hold_ms int, p_rollback boolean)
LANGUAGE plpgsql AS $$
DECLARE
    pids bigint[] := '{}';
    v_pid bigint;
    v_id bigint;
    e record;
BEGIN
    FOR e IN
        WITH picks AS (
            SELECT CASE WHEN random() < 0.5 THEN 'orders' ELSE 'payments' END AS topic,
                   1 + floor(random() * 40)::int AS k, NULL::text AS dedup, 0 AS last
              FROM generate_series(1, p_events)
            UNION ALL
            SELECT 'orders', 0, 'd' || (1 + floor(random() * 300)::int), 1
             WHERE random() < 0.1)
        SELECT topic, CASE WHEN k BETWEEN 1 AND 32 THEN 'k' || k END AS key, dedup
          FROM picks ORDER BY last, random()
    LOOP
        v_pid := nextval('payload_seq');
        v_id := idempotency.outbox_enqueue(e.topic, jsonb_build_object('pid', v_pid), e.key,
                                           NULL, e.dedup);
        INSERT INTO produced (pid, event_id, topic, key, dedup_key, client)
        VALUES (v_pid, v_id, e.topic, e.key, e.dedup, p_client);
        pids := pids || v_pid;
    END LOOP;
    IF p_hold_ms > 0 THEN
        PERFORM pg_sleep(p_hold_ms / 1000.0);
    END IF;
    IF p_rollback THEN
        ROLLBACK;
        INSERT INTO rolled_back SELECT unnest(pids), p_client;
    END IF;
    COMMIT;
END $$;

-- One relay round. Transaction 1: claim a batch and log it. Then, by
-- p_fate (1..100), either inside that transaction (the claim is held by its
-- row locks and written only if it outlives the transaction):
--    1-12  delivers to the receiver and acks, then commits;
--   13-16  nacks every event retryably, then commits;
--   17-20  delivers and acks, then dies before the commit (rolls back);
-- or after committing it (the claim is written with its lease):
--   21-25  dies before delivering (the lease runs out, someone re-claims);
--   26-34  the sink fails: nack every event retryably (within the lease);
--   35-40  delivers (transaction 2) and dies before acking;
--   41-48  delivers, stalls past its lease, then acks late (transaction 3);
--   49-    delivers, then acks.
CREATE PROCEDURE relay_round(p_relay int, p_batch int, p_lease_ms int, p_fate int,
                             INOUT handed_out int DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    v_cno bigint := nextval('claim_seq');
    v_started timestamptz := clock_timestamp();
    v_fate text := CASE WHEN p_fate <= 12 THEN 'ack-in-claim'
                        WHEN p_fate <= 16 THEN 'nack-in-claim'
                        WHEN p_fate <= 20 THEN 'die-in-claim'
                        WHEN p_fate <= 25 THEN 'die'
                        WHEN p_fate <= 34 THEN 'nack'
                        WHEN p_fate <= 40 THEN 'deliver-die'
                        WHEN p_fate <= 48 THEN 'late-ack'
                        ELSE 'ack' END;
    v_ids bigint[];
    r record;
BEGIN
    INSERT INTO claim_log (cno, event_id, topic, key, pid, attempt, relay, lease_ms, fate,
                           returned_at)
    SELECT v_cno, c.id, c.topic, c.key, (c.payload->>'pid')::bigint, c.attempt, p_relay,
           p_lease_ms, v_fate, '-infinity'
      FROM idempotency.outbox_claim('relay-' || p_relay, p_batch,
                                    make_interval(secs => p_lease_ms / 1000.0)) c;
    GET DIAGNOSTICS handed_out = ROW_COUNT;
    UPDATE claim_log SET returned_at = clock_timestamp() WHERE cno = v_cno;
    IF handed_out > 0 AND v_fate = 'nack-in-claim' THEN
        INSERT INTO nack_log
        SELECT v_cno, l.event_id, l.attempt,
               idempotency.outbox_nack(l.event_id, 'sink: 503', true,
                                       make_interval(secs => random() * 0.2))::text
          FROM claim_log l WHERE l.cno = v_cno ORDER BY l.event_id;
        COMMIT;
        RETURN;
    END IF;
    IF handed_out > 0 AND v_fate IN ('ack-in-claim', 'die-in-claim') THEN
        INSERT INTO receiver (event_id, topic, key, pid, attempt, cno, relay)
        SELECT l.event_id, l.topic, l.key, l.pid, l.attempt, v_cno, p_relay
          FROM claim_log l WHERE l.cno = v_cno ORDER BY l.event_id;
        SELECT array_agg(l.event_id ORDER BY l.event_id) INTO v_ids
          FROM claim_log l WHERE l.cno = v_cno;
        INSERT INTO ack_log SELECT v_cno, v_ids, idempotency.outbox_ack(v_ids), false;
        IF v_fate = 'die-in-claim' THEN
            ROLLBACK;
        END IF;
        COMMIT;
        RETURN;
    END IF;
    COMMIT;
    -- The lease this claim set, written when its transaction committed. The
    -- row is still this claim's: nobody else may take it before the lease
    -- ends (300 ms at least); were it taken all the same, the lease is
    -- taken as the earliest it could be, from the time before the claim.
    UPDATE claim_log l SET lease_until = coalesce(
        (SELECT o.lease_until FROM idempotency.outbox o
          WHERE o.id = l.event_id AND o.state = 'in_flight' AND o.attempts = l.attempt
            AND o.relay = 'relay-' || p_relay),
        v_started + make_interval(secs => p_lease_ms / 1000.0))
     WHERE l.cno = v_cno;
    COMMIT;
    IF handed_out = 0 OR v_fate = 'die' THEN
        RETURN;
    END IF;
    IF v_fate = 'nack' THEN
        -- outbox_nack cannot tell relays apart: a relay whose lease ran out
        -- must not nack (someone else may hold the event now), so events
        -- whose lease is over are left to expire, like a relay that died.
        -- The event's row is locked while it is still this claim's, so that
        -- no claim can take it between that look and the nack, however
        -- late this process runs (a look at the clock alone could not).
        INSERT INTO nack_log
        SELECT v_cno, l.event_id, l.attempt,
               idempotency.outbox_nack(l.event_id, 'sink: 503', true,
                                       make_interval(secs => random() * 0.2))::text
          FROM claim_log l
          JOIN LATERAL (SELECT FROM idempotency.outbox o
                         WHERE o.id = l.event_id AND o.state = 'in_flight' AND o.attempts = l.attempt
                           AND o.relay = 'relay-' || p_relay AND o.lease_until > clock_timestamp()
                           FOR UPDATE OF o) mine ON true
         WHERE l.cno = v_cno
         ORDER BY l.event_id;
        COMMIT;
        RETURN;
    END IF;
    -- Delivery: the receiver's own transaction, in id order.
    FOR r IN SELECT * FROM claim_log l WHERE l.cno = v_cno ORDER BY l.event_id LOOP
        INSERT INTO receiver (event_id, topic, key, pid, attempt, cno, relay)
        VALUES (r.event_id, r.topic, r.key, r.pid, r.attempt, v_cno, p_relay);
    END LOOP;
    COMMIT;
    IF v_fate = 'deliver-die' THEN
        RETURN;
    END IF;
    IF v_fate = 'late-ack' THEN
        PERFORM pg_sleep((p_lease_ms + 50 + random() * 150) / 1000.0);
    END IF;
    SELECT array_agg(l.event_id ORDER BY l.event_id) INTO v_ids FROM claim_log l WHERE l.cno = v_cno;
    INSERT INTO ack_log SELECT v_cno, v_ids, idempotency.outbox_ack(v_ids), v_fate = 'late-ack';
    COMMIT;
END $$;
