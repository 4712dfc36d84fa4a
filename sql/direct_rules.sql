-- The rules of the executor that the direct table access keeps besides
-- triggers and indexes (sql/direct_writes.sql): a read-only transaction
-- refuses every write and lock, the counts follow a prepared transaction
-- to its COMMIT PREPARED or ROLLBACK PREPARED, a trigger that changes a new
-- key's key ends with a clear error, and deferred triggers fire at the
-- commit as for the owner's own statements.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- Without a notifier (the workers are off here) a commit sends its own
-- NOTIFY, which a prepared transaction may not.
SET idempotency.outbox_notify = off;

-- Read-only: each call that writes or locks is refused with 25006, as the
-- statement it stands for is, and nothing is written.
SELECT token AS t FROM idempotency.idem_claim('ro-key', NULL, '1 hour', 'rules') \gset
SELECT idempotency.outbox_enqueue('rules-ro', '{"n": 1}', 'k') AS ro_event \gset
SELECT id AS ro_held FROM idempotency.outbox_claim('rules-relay', 1, '1 hour', '{rules-ro}') \gset
SELECT idempotency.outbox_enqueue('rules-ro', '{"n": 2}') AS ro_free \gset
\set VERBOSITY sqlstate
BEGIN READ ONLY;
SELECT idempotency.idem_complete('ro-key', :t, '{}', 'rules');
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.idem_heartbeat('ro-key', :t, '1 minute', 'rules');
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.idem_fail('ro-key', :t, 'x', true, NULL, 'rules');
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.idem_release('ro-key', :t, 'rules');
ROLLBACK;
BEGIN READ ONLY;
SELECT count(*) FROM idempotency.outbox_claim('rules-relay', 5, '1 minute', '{rules-ro}');
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.outbox_ack(ARRAY[:ro_held]::bigint[]);
ROLLBACK;
SET default_transaction_read_only = on;
SELECT idempotency.idem_complete('ro-key', :t, '{}', 'rules');
SELECT count(*) FROM idempotency.outbox_claim('rules-relay', 5, '1 minute', '{rules-ro}');
SELECT idempotency.outbox_ack(ARRAY[:ro_held]::bigint[]);
RESET default_transaction_read_only;
\set VERBOSITY default
SELECT status, lease_until > now() + interval '50 minutes' AS lease_kept
  FROM idempotency.idempotency_keys WHERE scope = 'rules' AND key = 'ro-key';
SELECT id = :ro_held AS held, state, attempts FROM idempotency.outbox
 WHERE topic = 'rules-ro' ORDER BY id;
SELECT outcome FROM idempotency.idem_complete('ro-key', :t, '{}', 'rules');
SELECT idempotency.outbox_ack(ARRAY[:ro_held]::bigint[]);
SELECT idempotency.outbox_discard(ARRAY[:ro_free]::bigint[]) IS NOT NULL AS discarded;

-- Prepared transactions: their changes to the counts are applied when
-- COMMIT PREPARED commits them, not at PREPARE, and never after ROLLBACK
-- PREPARED.
CREATE TEMP VIEW rules_counts AS
SELECT (SELECT coalesce(sum(completed), 0) FROM idempotency.idem_stats WHERE scope = 'rules') AS completed,
       (SELECT coalesce(sum(pending), 0) FROM idempotency.outbox_lag WHERE topic = 'rules-2pc') AS pending;
SELECT * FROM rules_counts;
BEGIN;
SELECT token AS t FROM idempotency.idem_claim('prepared-1', NULL, NULL, 'rules') \gset
SELECT outcome FROM idempotency.idem_complete('prepared-1', :t, NULL, 'rules');
SELECT idempotency.outbox_enqueue('rules-2pc', '{}', 'k') > 0 AS enqueued;
PREPARE TRANSACTION 'rules-rollback';
SELECT * FROM rules_counts;
ROLLBACK PREPARED 'rules-rollback';
SELECT * FROM rules_counts;
BEGIN;
SELECT token AS t FROM idempotency.idem_claim('prepared-2', NULL, NULL, 'rules') \gset
SELECT outcome FROM idempotency.idem_complete('prepared-2', :t, NULL, 'rules');
SELECT idempotency.outbox_enqueue('rules-2pc', '{}', 'k') > 0 AS enqueued;
SELECT idempotency.outbox_enqueue('rules-2pc', '{}') > 0 AS enqueued;
PREPARE TRANSACTION 'rules-commit';
SELECT * FROM rules_counts;
COMMIT PREPARED 'rules-commit';
SELECT * FROM rules_counts;
-- A savepoint rolled back inside a prepared transaction takes its part away.
BEGIN;
SAVEPOINT s;
SELECT token AS t FROM idempotency.idem_claim('prepared-3', NULL, NULL, 'rules') \gset
SELECT outcome FROM idempotency.idem_complete('prepared-3', :t, NULL, 'rules');
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.outbox_enqueue('rules-2pc', '{}') > 0 AS enqueued;
PREPARE TRANSACTION 'rules-savepoint';
COMMIT PREPARED 'rules-savepoint';
SELECT * FROM rules_counts;
-- The counts agree with the tables.
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'rules' AND status = 'COMPLETED') AS completed_rows,
       (SELECT count(*) FROM idempotency.outbox WHERE topic = 'rules-2pc' AND state = 'pending') AS pending_rows;
-- The trigger that has the counts recounted after a TRUNCATE
-- (sql/truncate.sql) fires only as that: called otherwise, 39P01.
\set VERBOSITY sqlstate
SELECT idempotency.counts_truncated();
\set VERBOSITY default

-- A BEFORE INSERT trigger that gives a new key another key: the claim ends
-- at once with a clear error (27000), whether that key exists or not.
SELECT outcome FROM idempotency.idem_claim('taken', NULL, NULL, 'rules');
CREATE FUNCTION public.rules_rekey() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.scope = 'rules' THEN
        NEW.key := CASE WHEN NEW.key = 'to-new' THEN 'renamed' ELSE 'taken' END;
    END IF;
    RETURN NEW;
END $f$;
CREATE TRIGGER rules_rekey BEFORE INSERT ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.rules_rekey();
SET statement_timeout = '20s';
\set VERBOSITY sqlstate
SELECT outcome FROM idempotency.idem_claim('to-taken', NULL, NULL, 'rules');
SELECT outcome FROM idempotency.idem_register('to-taken', NULL, NULL, 'rules');
SELECT outcome FROM idempotency.idem_claim('to-new', NULL, NULL, 'rules');
\set VERBOSITY default
SELECT outcome FROM idempotency.idem_claim('to-new', NULL, NULL, 'rules');
RESET statement_timeout;
DROP TRIGGER rules_rekey ON idempotency.idempotency_keys;
DROP FUNCTION public.rules_rekey();
SELECT key FROM idempotency.idempotency_keys WHERE scope = 'rules' AND key IN ('taken', 'to-taken', 'to-new', 'renamed') ORDER BY key;

-- Deferred triggers: a deferred constraint trigger on the outbox and on
-- the keys table, and a deferred foreign key reached through a trigger,
-- fire at the commit as for the owner's own INSERT and UPDATE.
CREATE TABLE public.rules_fired (n serial PRIMARY KEY, what text NOT NULL);
CREATE FUNCTION public.rules_note() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.rules_fired (what)
    VALUES (concat_ws(' ', TG_NAME, TG_OP, TG_TABLE_NAME,
                      coalesce(row_to_json(NEW)->>'state', row_to_json(NEW)->>'status')));
    RETURN NULL;
END $f$;
CREATE CONSTRAINT TRIGGER rules_deferred AFTER INSERT OR UPDATE ON idempotency.outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.rules_note();
CREATE CONSTRAINT TRIGGER rules_deferred AFTER INSERT OR UPDATE ON idempotency.idempotency_keys
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.rules_note();
CREATE TABLE public.rules_parent (topic text PRIMARY KEY);
CREATE TABLE public.rules_child (topic text REFERENCES public.rules_parent DEFERRABLE INITIALLY DEFERRED);
CREATE FUNCTION public.rules_follow() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.rules_child VALUES (NEW.topic);
    RETURN NULL;
END $f$;
CREATE TRIGGER rules_follow AFTER INSERT ON idempotency.outbox
    FOR EACH ROW EXECUTE FUNCTION public.rules_follow();
BEGIN;
SELECT idempotency.outbox_enqueue('rules-deferred', '{}') > 0 AS enqueued;
SELECT idempotency.outbox_enqueue('rules-deferred', '{}', 'k') > 0 AS enqueued;
SELECT count(*) FROM public.rules_fired;
-- The deferred foreign key holds at the commit: its parent comes later in
-- the transaction.
INSERT INTO public.rules_parent VALUES ('rules-deferred');
COMMIT;
SELECT what FROM public.rules_fired ORDER BY n;
TRUNCATE public.rules_fired;
BEGIN;
SELECT array_agg(id ORDER BY id) AS held FROM idempotency.outbox_claim('rules-relay', 10, '1 minute', '{rules-deferred}') \gset
SELECT token AS t FROM idempotency.idem_claim('deferred', NULL, NULL, 'rules') \gset
SELECT outcome FROM idempotency.idem_complete('deferred', :t, NULL, 'rules');
COMMIT;
SELECT what FROM public.rules_fired ORDER BY n;
TRUNCATE public.rules_fired;
SELECT idempotency.outbox_ack(:'held') AS acked;
SELECT what FROM public.rules_fired ORDER BY n;
-- Without its parent the deferred foreign key fails at the commit, and the
-- enqueue goes with it.
BEGIN;
SELECT idempotency.outbox_enqueue('rules-orphan', '{}') > 0 AS enqueued;
\set VERBOSITY sqlstate
COMMIT;
\set VERBOSITY default
SELECT count(*) AS orphans FROM idempotency.outbox WHERE topic = 'rules-orphan';
DROP TRIGGER rules_deferred ON idempotency.outbox;
DROP TRIGGER rules_deferred ON idempotency.idempotency_keys;
DROP TRIGGER rules_follow ON idempotency.outbox;
DROP FUNCTION public.rules_note();
DROP FUNCTION public.rules_follow();
DROP TABLE public.rules_child, public.rules_parent, public.rules_fired;
-- Clean up for the suites that follow.
DELETE FROM idempotency.outbox WHERE topic LIKE 'rules-%';
DELETE FROM idempotency.idempotency_keys WHERE scope = 'rules';
RESET idempotency.outbox_notify;
