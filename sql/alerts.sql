-- The alert queries of docs/monitoring.md, in every state that matters to
-- them: each answers true or false, never NULL and never no row. Runs in a
-- database of its own so that the alerts see only its keys and events.
CREATE DATABASE idem_alerts;
\c idem_alerts
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- Thresholds shorter than an operator's, so that the test need not wait.
\set lag_limit '1s'
\set relay_silence '1s'
-- The four queries as the page writes them, one column each.
CREATE TEMP VIEW alerts AS SELECT
  (SELECT coalesce(sum(stuck), 0) > 0 FROM idempotency.idem_stats) AS stuck_work,
  (SELECT coalesce(sum(dead), 0) > 0 FROM idempotency.outbox_lag) AS dead_letters,
  (SELECT coalesce(max(lag), interval '0') > :'lag_limit'::interval FROM idempotency.outbox_lag)
      AS outbox_lagging,
  (SELECT coalesce(bool_or(lag > :'relay_silence'::interval
                           AND (last_delivered_at IS NULL
                                OR last_delivered_at < clock_timestamp() - :'relay_silence'::interval)),
                   false)
     FROM idempotency.outbox_lag) AS no_relay;
CREATE TEMP TABLE t (label text PRIMARY KEY, token bigint);

-- Empty tables.
SELECT * FROM alerts;

-- No relay ever seen: an event waits, nothing was ever delivered.
SELECT idempotency.outbox_enqueue('orders', '{"n": 1}') > 0 AS enqueued;
SELECT * FROM alerts;
SELECT pg_sleep(1.2);
SELECT * FROM alerts;
SELECT last_delivered_at IS NULL AS never_delivered FROM idempotency.outbox_lag WHERE topic = 'orders';

-- A relay delivers.
SELECT count(*) AS acked FROM (
    SELECT idempotency.outbox_ack(array_agg(id)) FROM idempotency.outbox_claim('relay-1', 10, '1 min')) a;
SELECT * FROM alerts;

-- The relay stopped: the next event waits past the threshold and the last
-- delivery is older than it.
SELECT idempotency.outbox_enqueue('orders', '{"n": 2}') > 0 AS enqueued;
SELECT pg_sleep(1.2);
SELECT * FROM alerts;
-- Another topic's relay, still running, does not hide it.
SELECT idempotency.outbox_enqueue('invoices', '{"n": 1}') > 0 AS enqueued;
SELECT count(*) AS acked FROM (
    SELECT idempotency.outbox_ack(array_agg(id))
      FROM idempotency.outbox_claim('relay-2', 10, '1 min', '{invoices}')) a;
SELECT * FROM alerts;
SELECT count(*) AS acked FROM (
    SELECT idempotency.outbox_ack(array_agg(id)) FROM idempotency.outbox_claim('relay-1', 10, '1 min')) a;
SELECT * FROM alerts;

-- A dead letter, until it is discarded; it holds back no lag of its own.
SELECT idempotency.outbox_enqueue('orders', '{"poison": true}') > 0 AS enqueued;
SELECT idempotency.outbox_nack(d.id, 'rejected', false)
  FROM idempotency.outbox_claim('relay-1', 10, '1 min') d;
SELECT * FROM alerts;
SELECT idempotency.outbox_discard(array_agg(id)) AS discarded FROM idempotency.outbox_dead_letters;
SELECT * FROM alerts;

-- Stuck work: a lease that ran out, until the sweep expires it ...
INSERT INTO t SELECT 'short', token FROM idempotency.idem_claim('job-1', lease => '0.2s');
SELECT * FROM alerts;
SELECT pg_sleep(0.3);
SELECT * FROM alerts;
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_leases';
SELECT * FROM alerts;
-- ... and a RECEIVED key older than idempotency.stuck_after, until claimed.
SET idempotency.stuck_after = '0.2s';
SELECT outcome FROM idempotency.idem_register('job-2');
SELECT pg_sleep(0.3);
SELECT * FROM alerts;
INSERT INTO t SELECT 'job-2', token FROM idempotency.idem_claim('job-2');
SELECT outcome FROM idempotency.idem_complete('job-2', (SELECT token FROM t WHERE label = 'job-2'), retain => '0');
SELECT * FROM alerts;
RESET idempotency.stuck_after;

-- Everything purged: finished keys and delivered events past their
-- retention are gone; the last delivery is still known.
SELECT outcome FROM idempotency.idem_complete('job-1', (SELECT token FROM t WHERE label = 'short'), retain => '0');
ALTER SYSTEM SET idempotency.outbox_retention = 0;
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SELECT task, rows FROM idempotency.idem_maintenance() WHERE task IN ('purge_keys', 'purge_outbox');
SELECT (SELECT count(*) FROM idempotency.idempotency_keys) AS keys,
       (SELECT count(*) FROM idempotency.outbox) AS events;
SELECT * FROM alerts;
SELECT topic, pending, dead, last_delivered_at IS NOT NULL AS last_delivery_known, counted_by
  FROM idempotency.outbox_lag ORDER BY topic;
-- Then the relay stops, all history purged: the alert still fires ...
SELECT idempotency.outbox_enqueue('orders', '{"n": 3}') > 0 AS enqueued;
SELECT pg_sleep(1.2);
SELECT * FROM alerts;
-- ... and so it does once the last delivery is forgotten too (the counts
-- recounted from tables that no longer hold it, as after a restart).
SELECT idempotency.request_sweep();
SELECT topic, pending, last_delivered_at IS NULL AS last_delivery_unknown
  FROM idempotency.outbox_lag ORDER BY topic;
SELECT * FROM alerts;
ALTER SYSTEM RESET idempotency.outbox_retention;
SELECT pg_reload_conf();

\c contrib_regression
DROP DATABASE idem_alerts;
