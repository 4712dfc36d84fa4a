-- The functions change their tables directly, not through SQL statements,
-- with what INSERT and UPDATE do: row and statement triggers fire (on the
-- columns an UPDATE would name, with transition tables), a BEFORE trigger's
-- changes are what is written, constraints are checked, every index is kept
-- (also one created or dropped between two calls of one session), and a
-- complete stays a HOT update.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE TABLE public.fired (n serial PRIMARY KEY, what text NOT NULL);
CREATE FUNCTION public.note_row() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.fired (what)
    VALUES (concat_ws(' ', TG_NAME, TG_WHEN, TG_OP,
                      coalesce(row_to_json(NEW)->>'status', row_to_json(NEW)->>'state')));
    RETURN NEW;
END $f$;
CREATE FUNCTION public.note_statement() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.fired (what) VALUES (concat_ws(' ', TG_NAME, TG_WHEN, TG_OP, 'statement'));
    RETURN NULL;
END $f$;
CREATE FUNCTION public.note_new_rows() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.fired (what)
    SELECT concat_ws(' ', TG_NAME, TG_OP, count(*), 'new row(s)', string_agg(status::text, ','))
      FROM new_rows;
    RETURN NULL;
END $f$;
-- A BEFORE trigger that changes the row: the change is what is stored.
CREATE FUNCTION public.stamp_job() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.status = 'COMPLETED' THEN
        NEW.job_ref := 'stamped by a trigger';
    END IF;
    RETURN NEW;
END $f$;

CREATE TRIGGER k_before_row BEFORE INSERT OR UPDATE ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER k_after_row AFTER INSERT OR UPDATE OR DELETE ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER k_lease_only BEFORE UPDATE OF lease_until ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER k_before_statement BEFORE UPDATE ON idempotency.idempotency_keys
    FOR EACH STATEMENT EXECUTE FUNCTION public.note_statement();
CREATE TRIGGER k_new_rows AFTER UPDATE ON idempotency.idempotency_keys
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.note_new_rows();
CREATE TRIGGER k_stamp BEFORE UPDATE ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.stamp_job();

-- A claim inserts; a heartbeat changes lease_until (the column trigger
-- fires); a complete does not (it leaves lease_until).
SELECT token AS t FROM idempotency.idem_claim('direct-1', lease => '1 min') \gset
SELECT idempotency.idem_heartbeat('direct-1', :t, '2 min') > now() AS renewed;
SELECT outcome FROM idempotency.idem_complete('direct-1', :t, '{"ok": true}');
SELECT status, job_ref, result FROM idempotency.idem_get('direct-1');
SELECT what FROM public.fired ORDER BY n;
TRUNCATE public.fired;

-- A takeover and a failure are updates too; a release that deletes fires
-- the delete triggers.
SELECT token AS t FROM idempotency.idem_claim('direct-2', lease => '1 min') \gset
SELECT idempotency.idem_fail('direct-2', :t, 'boom', true, retry_in => '0s');
SELECT token AS t FROM idempotency.idem_claim('direct-2') \gset
SELECT idempotency.idem_release('direct-2', :t);
SELECT token AS t FROM idempotency.idem_claim('direct-3') \gset
SELECT idempotency.idem_release('direct-3', :t);
SELECT idempotency.idem_get('direct-3') IS NULL AS deleted;
SELECT what FROM public.fired ORDER BY n;
TRUNCATE public.fired;
DROP TRIGGER k_before_row ON idempotency.idempotency_keys;
DROP TRIGGER k_after_row ON idempotency.idempotency_keys;
DROP TRIGGER k_lease_only ON idempotency.idempotency_keys;
DROP TRIGGER k_before_statement ON idempotency.idempotency_keys;
DROP TRIGGER k_new_rows ON idempotency.idempotency_keys;
DROP TRIGGER k_stamp ON idempotency.idempotency_keys;

-- A constraint added to the table is checked by a complete.
ALTER TABLE idempotency.idempotency_keys
    ADD CONSTRAINT direct_short_result CHECK (result IS NULL OR length(result::text) < 40) NOT VALID;
SELECT token AS t FROM idempotency.idem_claim('direct-4') \gset
\set VERBOSITY sqlstate
SELECT idempotency.idem_complete('direct-4', :t, jsonb_build_object('long', repeat('x', 60)));
\set VERBOSITY default
SELECT outcome FROM idempotency.idem_complete('direct-4', :t, '{"short": 1}');
ALTER TABLE idempotency.idempotency_keys DROP CONSTRAINT direct_short_result;

-- An index created between two calls of this session gets the next rows'
-- entries; one dropped is no longer written.
SELECT outcome FROM idempotency.idem_claim('direct-5');
CREATE INDEX direct_by_job ON idempotency.idempotency_keys (job_ref) WHERE job_ref LIKE 'direct%';
SELECT outcome FROM idempotency.idem_register('direct-6', job_ref => 'direct job');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT key FROM idempotency.idempotency_keys WHERE job_ref LIKE 'direct%' AND job_ref = 'direct job';
SELECT key FROM idempotency.idempotency_keys WHERE job_ref LIKE 'direct%' AND job_ref = 'direct job';
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.direct_by_job;
SELECT outcome FROM idempotency.idem_register('direct-7', job_ref => 'direct job 2');

-- A column added with a default gets it in a new key's row.
ALTER TABLE idempotency.idempotency_keys ADD COLUMN direct_extra int DEFAULT 7;
SELECT outcome FROM idempotency.idem_claim('direct-9');
SELECT key, direct_extra FROM idempotency.idempotency_keys WHERE key = 'direct-9';
-- A key stored before the column was added has its default too, in the
-- table and in idem_get's row, read as a row and as a field.
SELECT key, direct_extra FROM idempotency.idempotency_keys WHERE key = 'direct-7';
SELECT key, direct_extra FROM idempotency.idem_get('direct-7');
SELECT (idempotency.idem_get('direct-7')).direct_extra;
ALTER TABLE idempotency.idempotency_keys DROP COLUMN direct_extra;
SELECT outcome FROM idempotency.idem_claim('direct-10');

-- A complete changes no indexed column: a HOT update (the statistics are
-- flushed after each statement, and read afresh).
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables
 WHERE relid = 'idempotency.idempotency_keys'::regclass \gset
SELECT token AS t FROM idempotency.idem_claim('direct-8') \gset
SELECT pg_stat_force_next_flush();
SELECT outcome FROM idempotency.idem_complete('direct-8', :t, '{"hot": true}');
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT n_tup_upd - :upd AS updates, n_tup_hot_upd - :hot AS hot_updates FROM pg_stat_user_tables
 WHERE relid = 'idempotency.idempotency_keys'::regclass;

-- The outbox: an enqueue is an INSERT with its triggers; a BEFORE trigger's
-- change is what is stored.
CREATE FUNCTION public.add_header() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    NEW.headers := coalesce(NEW.headers, '{}') || '{"via": "trigger"}';
    RETURN NEW;
END $f$;
CREATE TRIGGER o_before_row BEFORE INSERT ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION public.add_header();
CREATE TRIGGER o_after_row AFTER INSERT ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER o_after_statement AFTER INSERT ON idempotency.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION public.note_statement();
CREATE TRIGGER o_before_statement BEFORE INSERT ON idempotency.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION public.note_statement();
SELECT idempotency.outbox_enqueue('direct.topic', '{"n": 1}', 'k1') AS id \gset
SELECT topic, key, payload, headers, state, attempts FROM idempotency.outbox WHERE id = :id;
-- A second event of the key waits behind the first (no ready_at); one
-- without a key is ready at once.
SELECT idempotency.outbox_enqueue('direct.topic', '{"n": 2}', 'k1') AS id2 \gset
SELECT idempotency.outbox_enqueue('direct.topic', '{"n": 3}') AS id3 \gset
SELECT id = :id AS first, ready_at IS NOT NULL AS head, enqueued_at = updated_at AS stamped
  FROM idempotency.outbox WHERE topic = 'direct.topic' ORDER BY id;
SELECT what FROM public.fired ORDER BY n;
TRUNCATE public.fired;
DROP TRIGGER o_before_row ON idempotency.outbox;
DROP TRIGGER o_after_row ON idempotency.outbox;
DROP TRIGGER o_after_statement ON idempotency.outbox;
DROP TRIGGER o_before_statement ON idempotency.outbox;

-- An enqueue is found through every index of the outbox, also one created
-- after this session's first enqueue (amcheck finds every row of the table
-- in each index that should hold it); a constraint and a column default
-- added to the table hold for it.
CREATE EXTENSION amcheck;
CREATE INDEX direct_by_payload ON idempotency.outbox ((payload->>'n')) WHERE topic = 'direct.topic';
SELECT idempotency.outbox_enqueue('direct.topic', '{"n": 4}', 'k2') AS id4 \gset
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT id = :id4 AS by_new_index FROM idempotency.outbox WHERE topic = 'direct.topic' AND payload->>'n' = '4';
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT relname FROM (SELECT c.relname, bt_index_check(c.oid, true) FROM pg_index i
                       JOIN pg_class c ON c.oid = i.indexrelid
                      WHERE i.indrelid = 'idempotency.outbox'::regclass) AS checked ORDER BY 1;
DROP INDEX idempotency.direct_by_payload;
ALTER TABLE idempotency.outbox ADD CONSTRAINT direct_small CHECK (length(payload::text) < 40) NOT VALID;
ALTER TABLE idempotency.outbox ADD COLUMN direct_extra int DEFAULT 7;
\set VERBOSITY sqlstate
SELECT idempotency.outbox_enqueue('direct.topic', jsonb_build_object('long', repeat('x', 60)));
\set VERBOSITY default
SELECT idempotency.outbox_enqueue('direct.topic', '{"n": 5}') AS id5 \gset
SELECT direct_extra FROM idempotency.outbox WHERE id = :id5;
ALTER TABLE idempotency.outbox DROP COLUMN direct_extra;
ALTER TABLE idempotency.outbox DROP CONSTRAINT direct_small;
DELETE FROM idempotency.outbox WHERE topic = 'direct.topic';

-- An ack and the write of a claim at its commit are each one UPDATE of the
-- events by id: statement triggers fire once per call, also for an ack
-- that changes nothing, the transition table holds every row changed, row
-- triggers on a column fire where the statement names it (only the held
-- ack and the claim's write set relay), and every index keeps each row.
CREATE FUNCTION public.note_outbox_rows() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.fired (what)
    SELECT concat_ws(' ', TG_NAME, TG_OP, count(*), 'new row(s)',
                     string_agg(state || '/' || attempts, ',' ORDER BY id))
      FROM new_rows;
    RETURN NULL;
END $f$;
SELECT count(idempotency.outbox_enqueue('direct.acks', jsonb_build_object('n', n),
                                        CASE WHEN n > 3 THEN 'k' END)) AS enqueued
  FROM generate_series(1, 5) AS n;
CREATE TRIGGER o_update_statement BEFORE UPDATE ON idempotency.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION public.note_statement();
CREATE TRIGGER o_relay_only BEFORE UPDATE OF relay ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION public.note_row();
CREATE TRIGGER o_changed AFTER UPDATE ON idempotency.outbox
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.note_outbox_rows();
-- Events 1-3 and the head of key k (4) are claimed; 1 (named twice) and 4
-- acked in the claiming transaction; 2 and 3 written as claimed at its
-- commit, when 5 becomes the head of k.
BEGIN;
CREATE TEMP TABLE direct_claimed ON COMMIT DROP AS
    SELECT id, payload->>'n' AS n FROM idempotency.outbox_claim('direct-relay', 10, '1 min', ARRAY['direct.acks']);
SELECT string_agg(n, ' ' ORDER BY id) AS claimed FROM direct_claimed;
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM direct_claimed WHERE n IN ('4', '1', '1') ORDER BY n DESC)
                              || ARRAY(SELECT id FROM direct_claimed WHERE n = '1')) AS acked_held;
INSERT INTO public.fired (what) VALUES ('commit');
COMMIT;
SELECT payload->>'n' AS n, state, attempts, relay, lease_until IS NOT NULL AS leased,
       ready_at IS NOT NULL AS ready, delivered_at = updated_at AS delivered_then
  FROM idempotency.outbox WHERE topic = 'direct.acks' ORDER BY id;
-- A later ack of 2 and 3 (3 named twice, and an id that does not exist),
-- and one that finds nothing to change.
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox
                                     WHERE topic = 'direct.acks' AND payload->>'n' IN ('3', '2', '3'))
                              || ARRAY[-1::bigint]
                              || ARRAY(SELECT id FROM idempotency.outbox
                                        WHERE topic = 'direct.acks' AND payload->>'n' = '3')) AS acked;
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox
                                     WHERE topic = 'direct.acks' AND payload->>'n' = '1')) AS acked_again;
SELECT what FROM public.fired ORDER BY n;
TRUNCATE public.fired;
DROP TRIGGER o_update_statement ON idempotency.outbox;
DROP TRIGGER o_relay_only ON idempotency.outbox;
DROP TRIGGER o_changed ON idempotency.outbox;
SELECT payload->>'n' AS n, state, attempts, relay, lease_until IS NOT NULL AS leased,
       ready_at IS NOT NULL AS ready
  FROM idempotency.outbox WHERE topic = 'direct.acks' ORDER BY id;
SELECT pending, in_flight, retrying, dead, last_delivered_at IS NOT NULL AS delivered
  FROM idempotency.outbox_lag WHERE topic = 'direct.acks';
SELECT relname FROM (SELECT c.relname, bt_index_check(c.oid, true) FROM pg_index i
                       JOIN pg_class c ON c.oid = i.indexrelid
                      WHERE i.indrelid = 'idempotency.outbox'::regclass) AS checked ORDER BY 1;
DELETE FROM idempotency.outbox WHERE topic = 'direct.acks';

DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'direct-%';
DROP TABLE public.fired;
DROP FUNCTION public.note_row(), public.note_statement(), public.note_new_rows(),
    public.stamp_job(), public.add_header(), public.note_outbox_rows();
DROP EXTENSION amcheck;
