-- TRUNCATE of the extension's tables, as a DBA empties a backlog or a
-- table of finished keys: the counts of idem_stats and outbox_lag follow it
-- once it commits (recounted from the tables), not when it rolls back, and
-- a prepared one once COMMIT PREPARED commits it; the functions go on. Each
-- figure is printed beside the count of the table's rows. Runs in a
-- database of its own: it empties the tables.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_truncate;
\c idem_truncate
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- Without a notifier (the workers are off here) a commit sends its own
-- NOTIFY, which a prepared transaction may not.
SET idempotency.outbox_notify = off;

CREATE TEMP VIEW counts AS
SELECT (SELECT coalesce(sum(completed), 0) FROM idempotency.idem_stats WHERE scope = 'trunc') AS completed,
       (SELECT count(*) FROM idempotency.idempotency_keys
         WHERE scope = 'trunc' AND status = 'COMPLETED') AS completed_rows,
       (SELECT coalesce(sum(pending), 0) FROM idempotency.outbox_lag WHERE topic = 'trunc') AS pending,
       (SELECT count(*) FROM idempotency.outbox WHERE topic = 'trunc' AND state = 'pending') AS pending_rows;
CREATE FUNCTION pg_temp.finish(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (idempotency.idem_complete(key, (idempotency.idem_claim(key, NULL, NULL, 'trunc')).token,
                                      '{"done": true}', 'trunc')).outcome::text
$$;
CREATE FUNCTION pg_temp.enqueue(n int) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(idempotency.outbox_enqueue('trunc', jsonb_build_object('n', i), CASE WHEN i % 2 = 0 THEN 'k' || i END))
      FROM generate_series(1, n) i
$$;

SELECT pg_temp.finish('trunc-' || i) FROM generate_series(1, 5) i;
SELECT pg_temp.enqueue(4);
SELECT * FROM counts;

-- Rolled back: nothing changes.
BEGIN;
TRUNCATE idempotency.outbox;
ROLLBACK;
SELECT * FROM counts;

-- Committed: the figures are those of the emptied tables.
TRUNCATE idempotency.outbox;
SELECT * FROM counts;
BEGIN;
TRUNCATE idempotency.idempotency_keys;
SELECT pg_temp.finish('after-' || i) FROM generate_series(1, 2) i;
COMMIT;
SELECT * FROM counts;
-- A truncated key is a new key again.
SELECT pg_temp.finish('trunc-1');
SELECT * FROM counts;

-- In a session that skips ordinary triggers (session_replication_role =
-- replica, as a restore with --disable-triggers sets it): the same.
SELECT pg_temp.enqueue(2);
SET session_replication_role = replica;
TRUNCATE idempotency.outbox;
RESET session_replication_role;
SELECT * FROM counts;

-- In a savepoint rolled back: the rows stay, and so do the figures.
SELECT pg_temp.enqueue(3);
BEGIN;
SAVEPOINT s;
TRUNCATE idempotency.outbox;
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.enqueue(1);
COMMIT;
SELECT * FROM counts;

-- Prepared: the figures follow COMMIT PREPARED, not ROLLBACK PREPARED.
BEGIN;
TRUNCATE idempotency.outbox;
PREPARE TRANSACTION 'trunc-rollback';
ROLLBACK PREPARED 'trunc-rollback';
SELECT * FROM counts;
BEGIN;
TRUNCATE idempotency.outbox, idempotency.idempotency_keys;
SELECT pg_temp.enqueue(2);
SELECT pg_temp.finish('prepared');
PREPARE TRANSACTION 'trunc-commit';
COMMIT PREPARED 'trunc-commit';
SELECT * FROM counts;

-- The outbox hands out what is left, each event once, and acks it.
SELECT array_agg(id ORDER BY id) AS held FROM idempotency.outbox_claim('trunc-relay', 10, '1 minute', '{trunc}') \gset
SELECT cardinality(:'held'::bigint[]) AS claimed, idempotency.outbox_ack(:'held') AS acked;
SELECT * FROM counts;

\c contrib_regression
DROP DATABASE idem_truncate;
