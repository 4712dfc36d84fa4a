-- Checks after the outbox stress run and its drain. One row per figure:
-- name|value|verdict, where verdict is ok or FAIL for an invariant, info for
-- a figure that is only reported. Needs track_commit_timestamp = on.
\set ON_ERROR_STOP 1
-- Helpers materialised once, with the indexes the checks probe.
-- claimed_at: exact from the lease; for a claim settled in its own
-- transaction (no lease), the latest it can have been made, so that a
-- check reports only what certainly broke a lease.
CREATE TEMP TABLE claims AS
SELECT l.*, coalesce(l.lease_until - make_interval(secs => l.lease_ms / 1000.0), l.returned_at)
              AS claimed_at,
       pg_xact_commit_timestamp(l.xmin) AS committed_at
  FROM claim_log l;
CREATE INDEX ON claims (event_id, attempt);
CREATE TEMP TABLE firsts AS  -- the first delivery of each event
SELECT DISTINCT ON (event_id) event_id, topic, key, seq, attempt
  FROM receiver ORDER BY event_id, seq;
CREATE INDEX ON firsts (event_id);
CREATE INDEX ON receiver (event_id, attempt);
ANALYZE claims;
ANALYZE firsts;
ANALYZE receiver;
WITH
committed AS (SELECT DISTINCT event_id FROM produced),
-- When each event's enqueue committed: a key's events must be handed out
-- in that order (and in id order within one transaction).
enqueued AS (
    SELECT o.id, o.topic, o.key, pg_xact_commit_timestamp(p.xmin) AS committed_at
      FROM idempotency.outbox o JOIN produced p ON p.pid = (o.payload->>'pid')::bigint
     WHERE o.key IS NOT NULL),
order_breaks AS (  -- per (topic, key): first deliveries out of commit order
    SELECT * FROM (
        SELECT f.*, e.committed_at,
               lag(e.committed_at) OVER w AS prev_committed_at, lag(f.event_id) OVER w AS prev_id
          FROM firsts f JOIN enqueued e ON e.id = f.event_id WHERE f.key IS NOT NULL
        WINDOW w AS (PARTITION BY f.topic, f.key ORDER BY f.seq)) t
     WHERE (prev_committed_at, prev_id) > (committed_at, event_id)),
steps AS (  -- consecutive claims of one event
    SELECT c.*, lag(c.attempt) OVER w AS prev_attempt, lag(c.lease_until) OVER w AS prev_lease_until
      FROM claims c WINDOW w AS (PARTITION BY c.event_id ORDER BY c.attempt)),
dups AS (  -- deliveries after the first one of their event
    SELECT r.* FROM receiver r JOIN firsts f ON f.event_id = r.event_id WHERE r.seq <> f.seq),
dups_unexplained AS (
    -- A redelivery must come from a later claim of the same event, made after
    -- the lease of an earlier claim that had delivered it ran out.
    SELECT d.* FROM dups d
     WHERE NOT EXISTS (
         SELECT 1 FROM receiver e
           JOIN claims c1 ON c1.event_id = e.event_id AND c1.attempt = e.attempt
           JOIN claims c2 ON c2.event_id = d.event_id AND c2.attempt = d.attempt
          WHERE e.event_id = d.event_id AND e.attempt < d.attempt
            AND c2.claimed_at >= c1.lease_until)),
events AS (SELECT o.*, o.xmin AS row_xmin, (o.payload->>'pid')::bigint AS pid,
                  pg_xact_commit_timestamp(p.xmin) AS enqueue_committed
             FROM idempotency.outbox o LEFT JOIN produced p ON p.pid = (o.payload->>'pid')::bigint),
-- Per (topic, key), consecutive events in commit order: the next one was first handed out
-- (its claim committed) only after the previous one was delivered (the ack
-- that changed it committed: the row's xmin).
chain AS (
    SELECT e.id, e.topic, e.key, e.state,
           lag(e.id) OVER w AS prev_id,
           lag(pg_xact_commit_timestamp(e.row_xmin)) OVER w AS prev_delivered_commit,
           lag(e.state) OVER w AS prev_state
      FROM events e WHERE e.key IS NOT NULL
    WINDOW w AS (PARTITION BY e.topic, e.key ORDER BY e.enqueue_committed, e.id)),
early_handouts AS (
    SELECT ch.* FROM chain ch
      JOIN claims c ON c.event_id = ch.id AND c.attempt = 1
     WHERE ch.prev_id IS NOT NULL
       AND (ch.prev_state IS DISTINCT FROM 'delivered' OR c.committed_at <= ch.prev_delivered_commit)),
figures(ord, name, value, verdict) AS (
    SELECT 1, 'committed events never delivered',
           (SELECT count(*) FROM committed c WHERE NOT EXISTS (SELECT 1 FROM receiver r WHERE r.event_id = c.event_id)), 'zero'
    UNION ALL
    SELECT 2, 'committed events not in state delivered',
           (SELECT count(*) FROM committed c JOIN idempotency.outbox o ON o.id = c.event_id WHERE o.state <> 'delivered')
         + (SELECT count(*) FROM committed c WHERE NOT EXISTS (SELECT 1 FROM idempotency.outbox o WHERE o.id = c.event_id)), 'zero'
    UNION ALL
    SELECT 3, 'events left pending or in_flight', (SELECT count(*) FROM idempotency.outbox WHERE state IN ('pending', 'in_flight')), 'zero'
    UNION ALL
    SELECT 4, 'dead events', (SELECT count(*) FROM idempotency.outbox WHERE state = 'dead'), 'zero'
    UNION ALL
    SELECT 5, 'deliveries of rolled-back enqueues', (SELECT count(*) FROM receiver r JOIN rolled_back b ON b.pid = r.pid), 'zero'
    UNION ALL
    SELECT 6, 'deliveries of events no committed enqueue returned',
           (SELECT count(*) FROM receiver r WHERE NOT EXISTS (SELECT 1 FROM committed c WHERE c.event_id = r.event_id)), 'zero'
    UNION ALL
    SELECT 7, 'outbox events whose enqueue did not commit',
           (SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.pid = e.pid AND p.event_id = e.id))
         + (SELECT count(*) FROM events e JOIN rolled_back b ON b.pid = e.pid), 'zero'
    UNION ALL
    SELECT 8, 'per-key first deliveries out of enqueue commit order', (SELECT count(*) FROM order_breaks), 'zero'
    UNION ALL
    SELECT 8.6, 'events placed after a later id of their key (committed first)',
           (SELECT count(*) FROM idempotency.outbox WHERE key_seq IS NOT NULL), 'info'
    UNION ALL
    SELECT 9, 'per-key events handed out before the previous was delivered', (SELECT count(*) FROM early_handouts), 'zero'
    UNION ALL
    SELECT 10, 'redeliveries not after a lease expiry', (SELECT count(*) FROM dups_unexplained), 'zero'
    UNION ALL
    SELECT 11, 'deliveries per claim of an event above one',
           (SELECT count(*) FROM (SELECT 1 FROM receiver GROUP BY event_id, attempt HAVING count(*) > 1) x), 'zero'
    UNION ALL
    SELECT 12, 'events handed out while the previous lease lived (not nacked)',
           (SELECT count(*) FROM steps s
             WHERE s.prev_attempt IS NOT NULL AND s.claimed_at < s.prev_lease_until
               AND NOT EXISTS (SELECT 1 FROM nack_log n WHERE n.event_id = s.event_id AND n.attempt = s.prev_attempt)), 'zero'
    UNION ALL
    SELECT 13, 'claim attempts not 1, 2, 3, ... per event',
           (SELECT count(*) FROM steps WHERE attempt <> coalesce(prev_attempt, 0) + 1), 'zero'
    UNION ALL
    SELECT 14, 'sum of outbox_ack results - delivered events',
           (SELECT coalesce(sum(changed), 0) FROM ack_log) - (SELECT count(*) FROM idempotency.outbox WHERE state = 'delivered'), 'zero'
    UNION ALL
    SELECT 15, 'outbox events per (topic, dedup_key) above one',
           (SELECT count(*) FROM (SELECT 1 FROM idempotency.outbox WHERE dedup_key IS NOT NULL
                                   GROUP BY topic, dedup_key HAVING count(*) > 1) x), 'zero'
    UNION ALL
    SELECT 16, 'enqueues that rolled back', (SELECT count(*) FROM rolled_back), 'positive'
    UNION ALL
    SELECT 17, 'redelivered events (delivered more than once)',
           (SELECT count(DISTINCT event_id) FROM dups), 'positive'
    UNION ALL
    SELECT 18, 're-claims after a lease expiry',
           (SELECT count(*) FROM steps s WHERE s.prev_attempt IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM nack_log n WHERE n.event_id = s.event_id AND n.attempt = s.prev_attempt)), 'positive'
    UNION ALL
    SELECT 19, 'nacks (retryable)', (SELECT count(*) FROM nack_log), 'positive'
    UNION ALL
    SELECT 20, 'late acks (after the lease)', (SELECT count(*) FROM ack_log WHERE late), 'positive'
    UNION ALL
    SELECT 21, 'events acked or nacked in their claim''s transaction',
           (SELECT count(*) FROM claim_log WHERE fate IN ('ack-in-claim', 'nack-in-claim')), 'positive'
    UNION ALL
    SELECT 22, 'committed enqueue calls', (SELECT count(*) FROM produced), 'info'
    UNION ALL
    SELECT 23, 'committed events', (SELECT count(*) FROM committed), 'info'
    UNION ALL
    SELECT 24, '  of which without a key', (SELECT count(*) FROM events WHERE key IS NULL), 'info'
    UNION ALL
    SELECT 25, '  (topic, key) chains', (SELECT count(DISTINCT (topic, key)) FROM events WHERE key IS NOT NULL), 'info'
    UNION ALL
    SELECT 26, 'dedup hits (enqueue returned an existing event)',
           (SELECT count(*) FROM produced p JOIN events e ON e.id = p.event_id WHERE e.pid <> p.pid), 'info'
    UNION ALL
    SELECT 27, 'claims that handed out events', (SELECT count(DISTINCT cno) FROM claim_log), 'info'
    UNION ALL
    SELECT 28, 'events handed out (all attempts)', (SELECT count(*) FROM claim_log), 'info'
    UNION ALL
    SELECT 29, 'deliveries received', (SELECT count(*) FROM receiver), 'info'
    UNION ALL
    SELECT 30, 'duplicate deliveries', (SELECT count(*) FROM dups), 'info'
    UNION ALL
    SELECT 31, 'acks that changed nothing (late or repeated)', (SELECT count(*) FROM ack_log WHERE changed < cardinality(ids)), 'info'
    UNION ALL
    SELECT 32, 'highest attempt', (SELECT coalesce(max(attempt), 0) FROM claim_log), 'info'
)
SELECT name, value, verdict FROM (
    SELECT ord, name, coalesce(value::text, '') AS value,
           CASE verdict
               WHEN 'zero' THEN CASE WHEN value = 0 THEN 'ok' ELSE 'FAIL' END
               WHEN 'positive' THEN CASE WHEN value > 0 THEN 'ok' ELSE 'FAIL' END
               ELSE verdict END AS verdict
      FROM figures) t
 ORDER BY ord;
