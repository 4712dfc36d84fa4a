-- Where the SQL edition once answered or wrote otherwise than the C++
-- extension, found by the differential test (test/differential/) with the
-- SQL edition as its reference. Both editions run this file against one
-- expected output: the same answers, SQLSTATEs, rows and trigger firings.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- try(sql): 'ok', or the SQLSTATE it failed with; with the message when
-- asked, its numbers masked (tokens differ from run to run).
CREATE FUNCTION pg_temp.try(sql text, message bool DEFAULT false) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || CASE WHEN message THEN ': ' || regexp_replace(SQLERRM, '[0-9]+', 'N', 'g') ELSE '' END;
END $f$;
CREATE TABLE edition_log (name text, op text, id int8);
CREATE FUNCTION edition_note() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.edition_log VALUES (TG_NAME, TG_OP, CASE WHEN TG_LEVEL = 'ROW' THEN NEW.id END);
    RETURN NULL;
END $f$;
CREATE TRIGGER edition_insert AFTER INSERT ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION edition_note();
CREATE TRIGGER edition_update AFTER UPDATE ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION edition_note();
CREATE TRIGGER edition_update_attempts AFTER UPDATE OF attempts ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION edition_note();
CREATE TRIGGER edition_update_statement AFTER UPDATE ON idempotency.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION edition_note();
-- The ids of this file's events, in enqueue order, as 1, 2, 3.
CREATE TEMP TABLE events (n serial, id int8);
CREATE FUNCTION pg_temp.n(id int8) RETURNS int LANGUAGE sql AS $f$
    SELECT n FROM events WHERE events.id = $1 $f$;

-- A claim that hands out nothing writes nothing: no statement trigger fires.
SELECT count(*) FROM idempotency.outbox_claim('edition-relay', 10, '1 hour', '{edition.none}');
SELECT name, op FROM edition_log;

-- The first event of a key is its head at once: one INSERT, no UPDATE.
INSERT INTO events (id)
    SELECT idempotency.outbox_enqueue('edition.keyed', '{"n": 1}', key => 'k');
SELECT name, op, pg_temp.n(id) FROM edition_log ORDER BY 1;
TRUNCATE edition_log;

-- A claim hands out the due events oldest ready first. Two events, the
-- second nacked before the first, are ready in the other order than their
-- ids'. A nack's UPDATE names attempts, as the C++ extension's does.
INSERT INTO events (id)
    SELECT idempotency.outbox_enqueue('edition.order', '{"n": 2}') FROM generate_series(1, 2);
SELECT pg_temp.n(id) FROM idempotency.outbox_claim('edition-relay', 10, '1 hour', '{edition.order}');
TRUNCATE edition_log;
SELECT idempotency.outbox_nack((SELECT id FROM events WHERE n = 3), 'later', true, '0');
SELECT idempotency.outbox_nack((SELECT id FROM events WHERE n = 2), 'later', true, '0');
SELECT name, op, pg_temp.n(id) FROM edition_log ORDER BY 1, 3;
-- In a read-only transaction a claim with events due fails as their lock
-- would; one with nothing due answers nothing.
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_claim('edition-relay', 10, '1 hour', '{edition.order}')$$);
ROLLBACK;
BEGIN READ ONLY;
SELECT count(*) FROM idempotency.outbox_claim('edition-relay', 10, '1 hour', '{edition.none}');
COMMIT;
SELECT pg_temp.n(id), attempt
  FROM idempotency.outbox_claim('edition-relay', 10, '1 hour', '{edition.order, edition.keyed}');
-- Nothing of this file's is left for the next files' claims.
SELECT idempotency.outbox_ack(array_agg(id)) FROM events;
SELECT count(*) FROM idempotency.outbox WHERE topic LIKE 'edition.%' AND state <> 'delivered';
DROP TRIGGER edition_insert ON idempotency.outbox;
DROP TRIGGER edition_update ON idempotency.outbox;
DROP TRIGGER edition_update_attempts ON idempotency.outbox;
DROP TRIGGER edition_update_statement ON idempotency.outbox;

-- A key's retention, as a claim records it from idempotency.retention, in
-- hours and seconds (24 hours, not 1 day).
SELECT outcome FROM idempotency.idem_claim('edition-1', scope => 'edition_agreement');
SELECT retention::text FROM idempotency.idempotency_keys
 WHERE scope = 'edition_agreement' AND key = 'edition-1';
SET idempotency.retention = '2d';
SELECT outcome FROM idempotency.idem_claim('edition-2', scope => 'edition_agreement');
RESET idempotency.retention;
SELECT retention::text FROM idempotency.idempotency_keys
 WHERE scope = 'edition_agreement' AND key = 'edition-2';

-- In a read-only transaction a holder's call of a key that does not exist
-- is IK002 (there is no row to lock); of one that exists, 25006.
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT idempotency.idem_heartbeat('edition-absent', 1, '1 hour', 'edition_agreement')$$);
ROLLBACK;
BEGIN READ ONLY;
SELECT pg_temp.try(format('SELECT idempotency.idem_heartbeat(%L, %s, %L, %L)', 'edition-1',
    (SELECT token FROM idempotency.idempotency_keys WHERE scope = 'edition_agreement' AND key = 'edition-1'),
    '1 hour', 'edition_agreement'));
ROLLBACK;

-- A holder's change that a user's BEFORE trigger skips fails (XX000), in
-- each call; the key is as it was.
CREATE FUNCTION edition_skip() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RETURN NULL;
END $f$;
CREATE TRIGGER edition_skip BEFORE UPDATE ON idempotency.idempotency_keys
    FOR EACH ROW WHEN (current_setting('edition.skip', true) = 'on') EXECUTE FUNCTION edition_skip();
CREATE TEMP TABLE held AS
    SELECT token FROM idempotency.idempotency_keys WHERE scope = 'edition_agreement' AND key = 'edition-1';
SET edition.skip = on;
SELECT pg_temp.try(format('SELECT idempotency.idem_heartbeat(%L, %s, %L, %L)', 'edition-1',
    (SELECT token FROM held), '1 hour', 'edition_agreement'), true) AS heartbeat;
SELECT pg_temp.try(format('SELECT idempotency.idem_fail(%L, %s, %L, scope => %L)', 'edition-1',
    (SELECT token FROM held), 'boom', 'edition_agreement'), true) AS fail;
SELECT pg_temp.try(format('SELECT idempotency.idem_complete(%L, %s, scope => %L)', 'edition-1',
    (SELECT token FROM held), 'edition_agreement'), true) AS complete;
SELECT pg_temp.try(format('SELECT idempotency.idem_step(%L, %s, %L, scope => %L)', 'edition-1',
    (SELECT token FROM held), 'first', 'edition_agreement'), true) AS step;
RESET edition.skip;
SELECT status, steps FROM idempotency.idempotency_keys
 WHERE scope = 'edition_agreement' AND key = 'edition-1';
DROP TRIGGER edition_skip ON idempotency.idempotency_keys;
SELECT status FROM idempotency.idem_complete('edition-1', (SELECT token FROM held), scope => 'edition_agreement') AS c;

-- A user's BEFORE INSERT trigger that gives a new key another key is
-- refused (27000): the call would answer for a key it did not insert. One
-- that skips the new key's row is refused too (XX000). No key is left.
CREATE FUNCTION edition_rewrite() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.key = 'edition-skip' THEN
        RETURN NULL;
    END IF;
    NEW.key := NEW.key || '-moved';
    RETURN NEW;
END $f$;
CREATE TRIGGER edition_rewrite BEFORE INSERT ON idempotency.idempotency_keys
    FOR EACH ROW WHEN (NEW.scope = 'edition_agreement') EXECUTE FUNCTION edition_rewrite();
SELECT pg_temp.try($$SELECT idempotency.idem_claim('edition-new', scope => 'edition_agreement')$$, true) AS claim;
SELECT pg_temp.try($$SELECT idempotency.idem_register('edition-new', scope => 'edition_agreement')$$, true)
    AS register;
SELECT pg_temp.try($$SELECT idempotency.idem_claim('edition-skip', scope => 'edition_agreement')$$, true)
    AS claim_skipped;
SELECT pg_temp.try($$SELECT idempotency.idem_register('edition-skip', scope => 'edition_agreement')$$, true)
    AS register_skipped;
DROP TRIGGER edition_rewrite ON idempotency.idempotency_keys;
SELECT key, status FROM idempotency.idempotency_keys WHERE scope = 'edition_agreement' ORDER BY key;

-- A write that files a finished key for retention settles it in the same
-- write (a complete whose retention ends before its lease, a final
-- failure), and so does a retryable failure; a complete kept longer than
-- its lease leaves the key live for the sweep, and does not name
-- lease_until: a trigger on UPDATE OF lease_until fires for the other three.
CREATE FUNCTION edition_lease_named() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE NOTICE 'lease_until named: %', NEW.key;
    RETURN NULL;
END $f$;
CREATE TRIGGER edition_lease AFTER UPDATE OF lease_until ON idempotency.idempotency_keys
    FOR EACH ROW WHEN (NEW.scope = 'edition_settle') EXECUTE FUNCTION edition_lease_named();
CREATE TEMP TABLE settle_tokens AS
    SELECT k, (idempotency.idem_claim(k, lease => '1 hour', scope => 'edition_settle')).token
      FROM unnest('{file, final, keep, retry}'::text[]) AS k;
SELECT outcome FROM idempotency.idem_complete('file', (SELECT token FROM settle_tokens WHERE k = 'file'),
    retain => '0', scope => 'edition_settle');
SELECT idempotency.idem_fail('final', (SELECT token FROM settle_tokens WHERE k = 'final'), 'boom', false,
    scope => 'edition_settle');
SELECT outcome FROM idempotency.idem_complete('keep', (SELECT token FROM settle_tokens WHERE k = 'keep'),
    scope => 'edition_settle');
SELECT idempotency.idem_fail('retry', (SELECT token FROM settle_tokens WHERE k = 'retry'), 'boom', true,
    scope => 'edition_settle');
SELECT key, status, active_since IS NULL AS settled, lease_until IS NULL AS no_lease,
       purge_at IS NOT NULL AS filed
  FROM idempotency.idempotency_keys WHERE scope = 'edition_settle' ORDER BY key;
DROP TRIGGER edition_lease ON idempotency.idempotency_keys;
DROP FUNCTION edition_lease_named();

DROP TABLE edition_log;
DROP FUNCTION edition_note();
DROP FUNCTION edition_skip();
DROP FUNCTION edition_rewrite();
