-- idempotency 0.5.0 -> 0.6.0: heartbeats and completes are HOT updates, and
-- the monitoring views cost what they report (docs/monitoring.md).
--
-- active_since: set when a key becomes live (registered, or claimed when it
-- had none), kept while it is RECEIVED or PROCESSING and cleared by the
-- sweep once the key has left those states. No heartbeat and no complete
-- changes it, and no index follows lease_until any more, so both are HOT
-- updates; the lease sweeps and idem_stuck find the live keys through the
-- partial index on it and never read a finished key the sweep has settled.
--
-- idem_stats and outbox_lag take the counts of finished keys, undelivered
-- and dead events, and each topic's last delivery from counts in shared
-- memory that committing transactions adjust and that are recounted from
-- the tables after a server start (key_counts(), outbox_counts()).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- ---------------------------------------------------------------- keys

ALTER TABLE idempotency.idempotency_keys ADD COLUMN active_since pg_catalog.timestamptz;

-- The live keys are active since their claim (or registration).
UPDATE idempotency.idempotency_keys k
   SET active_since = COALESCE(k.claimed_at, k.updated_at)
 WHERE k.status OPERATOR(pg_catalog.=) ANY ('{RECEIVED,PROCESSING}');
-- What 0.5.0 left for the sweep to settle at the end of a finished key's
-- lease is settled now, as the sweep settles it from this version on.
UPDATE idempotency.idempotency_keys k
   SET lease_until = NULL, purge_at = k.expires_at
 WHERE k.lease_until IS NOT NULL
   AND k.status OPERATOR(pg_catalog.<>) ALL ('{RECEIVED,PROCESSING}');

CREATE INDEX idempotency_keys_active ON idempotency.idempotency_keys (active_since)
    WHERE active_since IS NOT NULL;
DROP INDEX idempotency.idempotency_keys_leases;

-- ---------------------------------------------------------------- counts

-- Per scope, the keys COMPLETED, FAILED_RETRYABLE and FAILED_FINAL, and a
-- row with scope NULL for all scopes; no row at all while the counts are not
-- known (on a standby, or not yet recounted since the server started).
CREATE FUNCTION idempotency.key_counts(
    OUT scope pg_catalog.text,
    OUT completed pg_catalog.int8,
    OUT failed_retryable pg_catalog.int8,
    OUT failed_final pg_catalog.int8)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_key_counts';

-- Per topic, the events pending or in flight, of them those handed out at
-- least once, the dead events, and the last delivery (remembered after the
-- delivered events are purged, until the server restarts); a row with
-- topic NULL for all topics; no row at all while the counts are not known.
CREATE FUNCTION idempotency.outbox_counts(
    OUT topic pg_catalog.text,
    OUT undelivered pg_catalog.int8,
    OUT handed_out pg_catalog.int8,
    OUT dead pg_catalog.int8,
    OUT last_delivered_at pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_outbox_counts';

REVOKE ALL ON FUNCTION idempotency.key_counts(), idempotency.outbox_counts() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.key_counts(), idempotency.outbox_counts() TO pg_monitor;

-- ---------------------------------------------------------------- views

-- Only live keys (through idempotency_keys_active) can be stuck.
CREATE OR REPLACE VIEW idempotency.idem_stuck AS
SELECT k.scope, k.key, k.status, k.token, k.attempts, k.lease_until, k.job_ref,
       k.holder_pid, k.created_at, k.updated_at,
       n.now OPERATOR(pg_catalog.-) k.updated_at AS stuck_for
  FROM idempotency.idempotency_keys k,
       (SELECT c.now, c.now OPERATOR(pg_catalog.-) idempotency.stuck_after() AS stuck_before
          FROM (SELECT pg_catalog.clock_timestamp() AS now) c) n
 WHERE k.active_since IS NOT NULL
   AND ((k.status OPERATOR(pg_catalog.=) 'PROCESSING'
         AND (k.lease_until OPERATOR(pg_catalog.<) n.now
              OR k.updated_at OPERATOR(pg_catalog.<) n.stuck_before))
     OR (k.status OPERATOR(pg_catalog.=) 'RECEIVED'
         AND k.updated_at OPERATOR(pg_catalog.<) n.stuck_before));

-- The live keys are counted (through idempotency_keys_active), the finished
-- ones come from key_counts(): NULL while it does not know them.
CREATE OR REPLACE VIEW idempotency.idem_stats AS
WITH n AS MATERIALIZED (
    SELECT c.now, c.now OPERATOR(pg_catalog.-) idempotency.stuck_after() AS stuck_before
      FROM (SELECT pg_catalog.clock_timestamp() AS now) c),
live AS (
    SELECT k.scope,
           pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'RECEIVED') AS received,
           pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'PROCESSING') AS processing,
           pg_catalog.count(*) FILTER (WHERE
               (k.status OPERATOR(pg_catalog.=) 'PROCESSING'
                AND (k.lease_until OPERATOR(pg_catalog.<) n.now
                     OR k.updated_at OPERATOR(pg_catalog.<) n.stuck_before))
            OR (k.status OPERATOR(pg_catalog.=) 'RECEIVED'
                AND k.updated_at OPERATOR(pg_catalog.<) n.stuck_before)) AS stuck,
           n.now OPERATOR(pg_catalog.-) pg_catalog.min(k.updated_at)
               FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'PROCESSING') AS oldest_processing_age
      FROM idempotency.idempotency_keys k, n
     WHERE k.active_since IS NOT NULL
     GROUP BY k.scope, n.now),
counted AS (SELECT * FROM idempotency.key_counts()),
known AS (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 AS yes FROM counted c
           WHERE c.scope IS NULL)
SELECT COALESCE(l.scope, f.scope) AS scope,
       COALESCE(l.received, 0::pg_catalog.int8) AS received,
       COALESCE(l.processing, 0::pg_catalog.int8) AS processing,
       CASE WHEN k.yes THEN COALESCE(f.completed, 0::pg_catalog.int8) END AS completed,
       CASE WHEN k.yes THEN COALESCE(f.failed_retryable, 0::pg_catalog.int8) END AS failed_retryable,
       CASE WHEN k.yes THEN COALESCE(f.failed_final, 0::pg_catalog.int8) END AS failed_final,
       COALESCE(l.stuck, 0::pg_catalog.int8) AS stuck,
       l.oldest_processing_age
  FROM live l
  FULL JOIN (SELECT * FROM counted c WHERE c.scope IS NOT NULL) f
    ON f.scope OPERATOR(pg_catalog.=) l.scope,
  known k;

-- Counts from outbox_counts() and the events in flight (outbox_in_flight);
-- the lag from the head of each topic's ready queue (outbox_ready, one
-- step per topic): since when the event that has waited longest to be
-- handed out has been due. pending + in_flight + retrying = undelivered.
CREATE OR REPLACE VIEW idempotency.outbox_lag AS
WITH RECURSIVE n AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS now),
ready_topics (topic) AS (
    (SELECT o.topic FROM idempotency.outbox o
      WHERE o.ready_at IS NOT NULL ORDER BY o.topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM idempotency.outbox o
             WHERE o.ready_at IS NOT NULL AND o.topic OPERATOR(pg_catalog.>) t.topic
             ORDER BY o.topic LIMIT 1)
      FROM ready_topics t
     WHERE t.topic IS NOT NULL),
-- Each topic's first head in ready order (outbox_ready's own order): due
-- when its ready_at has come, and then the one that has waited longest.
first_ready AS (
    SELECT t.topic,
           (SELECT o.ready_at FROM idempotency.outbox o
             WHERE o.topic OPERATOR(pg_catalog.=) t.topic AND o.ready_at IS NOT NULL
             ORDER BY o.topic, o.ready_at LIMIT 1) AS ready_at
      FROM ready_topics t
     WHERE t.topic IS NOT NULL),
due AS (
    SELECT r.topic,
           CASE WHEN r.ready_at OPERATOR(pg_catalog.<=) n.now THEN r.ready_at END AS since
      FROM first_ready r, n),
flying AS (
    SELECT o.topic,
           pg_catalog.count(*) FILTER (WHERE o.lease_until OPERATOR(pg_catalog.>) n.now) AS alive
      FROM idempotency.outbox o, n
     WHERE o.state OPERATOR(pg_catalog.=) 'in_flight'
     GROUP BY o.topic),
counted AS (SELECT * FROM idempotency.outbox_counts()),
known AS (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 AS yes FROM counted c
           WHERE c.topic IS NULL),
topics AS (SELECT * FROM counted c WHERE c.topic IS NOT NULL)
SELECT COALESCE(c.topic, d.topic, f.topic) AS topic,
       CASE WHEN k.yes THEN COALESCE(c.undelivered OPERATOR(pg_catalog.-) c.handed_out,
                                     0::pg_catalog.int8) END AS pending,
       COALESCE(f.alive, 0::pg_catalog.int8) AS in_flight,
       CASE WHEN k.yes THEN COALESCE(c.handed_out, 0::pg_catalog.int8)
                            OPERATOR(pg_catalog.-) COALESCE(f.alive, 0::pg_catalog.int8) END
           AS retrying,
       CASE WHEN k.yes THEN COALESCE(c.dead, 0::pg_catalog.int8) END AS dead,
       d.since AS oldest_pending_at,
       COALESCE(n.now OPERATOR(pg_catalog.-) d.since, '0'::pg_catalog.interval) AS lag,
       c.last_delivered_at
  FROM topics c
  FULL JOIN due d ON d.topic OPERATOR(pg_catalog.=) c.topic
  FULL JOIN flying f ON f.topic OPERATOR(pg_catalog.=) COALESCE(c.topic, d.topic),
  n, known k;

-- ---------------------------------------------------------------- roles

-- The monitoring kind reads the counts behind the views; relays read them
-- for outbox_lag.
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('relay', 'outbox_counts()', false),
    ('monitoring', 'key_counts()', false),
    ('monitoring', 'outbox_counts()', false);

-- Roles given a kind's rights before this version get its new functions:
-- readers of outbox_lag outbox_counts(), readers of idem_stats key_counts().
DO $grant$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role, n.function
          FROM (VALUES ('idempotency.outbox_lag', 'idempotency.outbox_counts()'),
                       ('idempotency.idem_stats', 'idempotency.key_counts()'))
               AS n(had, function),
               pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid OPERATOR(pg_catalog.=) n.had::pg_catalog.regclass
           AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', granted.function, granted.role);
    END LOOP;
END
$grant$;
