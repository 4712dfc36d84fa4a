-- idempotency 0.4.0 -> 0.5.0: an outbox whose claims cost what they hand
-- out. docs/outbox.md describes the queue; in short:
--
-- ready_at: set on the one event of each (topic, key) that is its key's
-- head (and on every event without a key): when it may next be handed out
-- (due, a retry's backoff, or the end of its lease while in flight). The
-- events waiting behind a head, and finished events, have none. Claims read
-- only the ready events of their topics that are due, oldest first, and
-- never the events waiting behind a head.
--
-- key_seq: the event's place in its key's order when it is not its id:
-- enqueue order is fixed when the enqueuing transaction commits, so an
-- event whose transaction commits after a later id of its key gets a place
-- after it; a redriven event gets the place of the head it waits behind.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

ALTER TABLE idempotency.outbox
    ADD COLUMN ready_at pg_catalog.timestamptz,
    ADD COLUMN key_seq pg_catalog.int8;

-- The heads of the events already queued, by the rules of 0.4.0: the
-- events without a key; per (topic, key), the one in flight, else the first
-- live event in id order. Live events of a key before its event in flight
-- (redriven meanwhile) wait behind it, in its place.
WITH live AS (
    SELECT o.id, o.topic, o.key, o.state, o.available_at, o.lease_until,
           pg_catalog.first_value(o.id) OVER w AS first_id,
           pg_catalog.max(o.id) FILTER (WHERE o.state OPERATOR(pg_catalog.=) 'in_flight') OVER w
               AS flying_id
      FROM idempotency.outbox o
     WHERE o.state OPERATOR(pg_catalog.=) ANY ('{pending,in_flight}')
    WINDOW w AS (PARTITION BY o.topic, o.key ORDER BY o.id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING))
UPDATE idempotency.outbox o
   SET ready_at = CASE
           WHEN l.key IS NOT NULL AND l.id OPERATOR(pg_catalog.<>) COALESCE(l.flying_id, l.first_id)
               THEN NULL
           WHEN l.state OPERATOR(pg_catalog.=) 'in_flight' THEN l.lease_until
           ELSE GREATEST(l.available_at, pg_catalog.now()) END,
       key_seq = CASE WHEN l.key IS NOT NULL AND l.id OPERATOR(pg_catalog.<) l.flying_id
                      THEN l.flying_id END
  FROM live l
 WHERE o.id OPERATOR(pg_catalog.=) l.id;

-- The ready queue: claims of given topics ...
CREATE INDEX outbox_ready ON idempotency.outbox (topic, ready_at, id)
    WHERE ready_at IS NOT NULL;
-- ... and of every topic.
CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at, id)
    WHERE ready_at IS NOT NULL;
-- Each key's events in its order, dead ones too (a dead event holds its
-- key's later events back until it is redriven or discarded): the next
-- head after an ack, and whether an enqueued event is its key's head. Keys
-- by a 64-bit hash of (topic, key), which readers recheck: eight bytes to
-- compare instead of two texts, on every insert and read.
CREATE INDEX outbox_key_order ON idempotency.outbox
    (pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(topic, 0)),
     (COALESCE(key_seq, id)), id)
    WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
-- The lease-expiry sweep, in lease order.
DROP INDEX idempotency.outbox_in_flight;
CREATE INDEX outbox_in_flight ON idempotency.outbox (lease_until)
    WHERE state = 'in_flight';
-- Claims no longer walk the live queue in id order.
DROP INDEX idempotency.outbox_live;
DROP INDEX idempotency.outbox_key_chain;

-- ---------------------------------------------------------------- dead heads

-- Dead events an operator gives up on: deleted, and the next event of each
-- key they held back becomes its head.
CREATE FUNCTION idempotency.outbox_discard(ids pg_catalog.int8[])
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_discard';
REVOKE ALL ON FUNCTION idempotency.outbox_discard(pg_catalog.int8[]) FROM PUBLIC;

-- Relay roles may discard their own topics' dead letters, like redrive
-- them; admins may ask for a sweep.
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('relay', 'outbox_discard(bigint[])', false),
    ('admin', 'request_sweep()', false);


-- ---------------------------------------------------------------- sweeps on request

-- Asks the background workers (library preloaded) to sweep this database
-- soon, whatever its due times say: after rows were written to the
-- extension's tables other than through its functions (a restore, a manual
-- UPDATE). Admin only.
CREATE FUNCTION idempotency.request_sweep()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_request_sweep';
REVOKE ALL ON FUNCTION idempotency.request_sweep() FROM PUBLIC;


-- Roles given a kind's rights before this version get its new functions:
-- the relays outbox_discard, the admins request_sweep.
DO $grant$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role, n.function
          FROM (VALUES ('idempotency.outbox_redrive(pg_catalog.int8[], pg_catalog.text)',
                        'idempotency.outbox_discard(pg_catalog.int8[])'),
                       ('idempotency.idem_maintenance()', 'idempotency.request_sweep()'))
               AS n(had, function),
               pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) n.had::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', granted.function, granted.role);
    END LOOP;
END
$grant$;
