-- The outbox's ready and key-order indexes, which claims, enqueues and acks
-- read directly, are found by their shape: under their names when those
-- have it, else wherever the outbox has it. A renamed index, or two names
-- swapped, goes on serving; an index of another definition under one of
-- their names is never read (its scan keys would be of another type) and,
-- when the outbox has no index of the shape, each call ends with 55000 and
-- the definition to create again. Runs in a database of its own.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_indexes;
\c idem_outbox_indexes
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;

-- Enqueues two events of a key and one without a key, claims with and
-- without topics, acks what the claims handed out: what every use of the
-- three indexes reads.
CREATE FUNCTION pg_temp.round(tag text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    of_topic bigint[];
    of_any bigint[];
BEGIN
    PERFORM idempotency.outbox_enqueue('t.' || tag, '{}', 'k');
    PERFORM idempotency.outbox_enqueue('t.' || tag, '{}', 'k');
    PERFORM idempotency.outbox_enqueue('u.' || tag, '{}');
    of_topic := ARRAY(SELECT id FROM idempotency.outbox_claim('r', 10, '1 min', ARRAY['t.' || tag]));
    of_any := ARRAY(SELECT id FROM idempotency.outbox_claim('r', 10, '1 min', ARRAY['t.' || tag, 'u.' || tag]));
    RETURN format('claimed %s of the topic, %s of both, acked %s', cardinality(of_topic),
                  cardinality(of_any), idempotency.outbox_ack(of_topic || of_any));
END $f$;
-- The index a case replaces, as the extension defines it.
CREATE FUNCTION pg_temp.restore() RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    DROP INDEX IF EXISTS idempotency.outbox_ready, idempotency.outbox_ready_all, idempotency.outbox_key_order;
    CREATE INDEX outbox_ready ON idempotency.outbox (topic, ready_at, id) WHERE ready_at IS NOT NULL;
    CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at, id) WHERE ready_at IS NOT NULL;
    CREATE INDEX outbox_key_order ON idempotency.outbox
        (hashtextextended(key, hashtextextended(topic, 0)), COALESCE(key_seq, id), id)
        WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
END $f$;
SELECT pg_temp.round('as-created');

-- Renamed: found by shape (the hand rebuild's window, between the drop of
-- the old index and the rename of the new one, is the same).
ALTER INDEX idempotency.outbox_ready RENAME TO ready_by_hand;
ALTER INDEX idempotency.outbox_key_order RENAME TO key_order_by_hand;
SELECT pg_temp.round('renamed');
ALTER INDEX idempotency.ready_by_hand RENAME TO outbox_ready;
ALTER INDEX idempotency.key_order_by_hand RENAME TO outbox_key_order;

-- Two names swapped in one transaction: each is read as what it is.
BEGIN;
ALTER INDEX idempotency.outbox_ready RENAME TO swapping;
ALTER INDEX idempotency.outbox_ready_all RENAME TO outbox_ready;
ALTER INDEX idempotency.swapping RENAME TO outbox_ready_all;
COMMIT;
SELECT pg_temp.round('swapped');

-- Another definition under a name, and no index of the definition: 55000,
-- never a read of the wrong index. Each case replaces one index. The hint
-- is shown; the context is not (it names the session's temporary schema).
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_ready;
CREATE INDEX outbox_ready ON idempotency.outbox (ready_at, topic, id) WHERE ready_at IS NOT NULL;
SELECT pg_temp.round('columns');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_ready;
CREATE INDEX outbox_ready ON idempotency.outbox (topic COLLATE "C", ready_at, id) WHERE ready_at IS NOT NULL;
SELECT pg_temp.round('collation');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_ready_all;
CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at DESC, id) WHERE ready_at IS NOT NULL;
SELECT pg_temp.round('descending');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_ready_all;
CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at, id) WHERE ready_at IS NOT NULL AND attempts < 5;
SELECT pg_temp.round('where');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_ready_all;
CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at, id);
SELECT pg_temp.round('no-where');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_key_order;
CREATE INDEX outbox_key_order ON idempotency.outbox
    (hashtextextended(key, hashtextextended(topic, 0)), COALESCE(key_seq, id), id)
    WHERE state IN ('pending', 'in_flight') AND key IS NOT NULL;
SELECT pg_temp.round('states');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_key_order;
CREATE INDEX outbox_key_order ON idempotency.outbox
    (hashtextextended(topic, hashtextextended(key, 0)), COALESCE(key_seq, id), id)
    WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
SELECT pg_temp.round('hash');
SELECT pg_temp.restore();
DROP INDEX idempotency.outbox_key_order;
CREATE INDEX outbox_key_order ON idempotency.outbox (hashtextextended(key, 0), id, ready_at)
    WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
SELECT pg_temp.round('key-order-columns');
\set VERBOSITY terse
\set SHOW_CONTEXT errors

-- Created again as the hint says, under any name: served again.
DROP INDEX idempotency.outbox_key_order;
CREATE INDEX key_order_again ON idempotency.outbox
    (hashtextextended(key, hashtextextended(topic, 0)), COALESCE(key_seq, id), id)
    WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
SELECT pg_temp.round('created-again');
-- Each round's second event of its key waited behind the first, acked in
-- the round: the heads now, found through key_order_again.
SELECT topic, state, count(*) FROM idempotency.outbox GROUP BY topic, state ORDER BY topic, state;
SELECT topic, key FROM idempotency.outbox_claim('r', 10, '1 min') ORDER BY topic;

\c contrib_regression
DROP DATABASE idem_outbox_indexes;
