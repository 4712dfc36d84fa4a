-- idempotency 0.6.0 -> 0.7.0: idem_stats and outbox_lag say how they had
-- their counts (counted_by). The counts a database keeps in shared memory
-- (idempotency.max_gauges scopes and topics over all databases) may not fit
-- there: that database's views then count from its tables at each read
-- (docs/monitoring.md), and the new last column of key_counts(),
-- outbox_counts() and the views tells which: 'commits' (kept in shared
-- memory as transactions commit), 'scan' (counted from the table by this
-- read) or 'unknown' (the figures are NULL: not counted yet, or a standby).
-- A TRUNCATE of idempotency_keys or outbox has the counts recounted.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.7.0'" to load this file. \quit

-- ------------------------------------------------------------------ locks

-- The update changes the keys table (a trigger, then new columns) and puts
-- a trigger on the outbox. Taken as it goes, the keys table's lock would
-- grow from SHARE ROW EXCLUSIVE to ACCESS EXCLUSIVE while an application's
-- statement that had read the table waited to write it: a deadlock. Taken
-- whole at once, first, the update waits for the statements before it and
-- holds nothing meanwhile; the keys table before the outbox, the order of a
-- transaction that completes a key and enqueues its event.
LOCK TABLE idempotency.idempotency_keys IN ACCESS EXCLUSIVE MODE;
LOCK TABLE idempotency.outbox IN SHARE ROW EXCLUSIVE MODE;

-- ---------------------------------------------------------------- counts

-- A function's result columns cannot change in place: the views leave them
-- for the moment of the update (same columns, no row; nobody sees this), so
-- that the views are replaced, never dropped (views of users built on them
-- stay).
CREATE OR REPLACE VIEW idempotency.idem_stats AS
SELECT NULL::pg_catalog.text AS scope, NULL::pg_catalog.int8 AS received,
       NULL::pg_catalog.int8 AS processing, NULL::pg_catalog.int8 AS completed,
       NULL::pg_catalog.int8 AS failed_retryable, NULL::pg_catalog.int8 AS failed_final,
       NULL::pg_catalog.int8 AS stuck, NULL::pg_catalog.interval AS oldest_processing_age
 WHERE false;
CREATE OR REPLACE VIEW idempotency.outbox_lag AS
SELECT NULL::pg_catalog.text AS topic, NULL::pg_catalog.int8 AS pending,
       NULL::pg_catalog.int8 AS in_flight, NULL::pg_catalog.int8 AS retrying,
       NULL::pg_catalog.int8 AS dead, NULL::pg_catalog.timestamptz AS oldest_pending_at,
       NULL::pg_catalog.interval AS lag, NULL::pg_catalog.timestamptz AS last_delivered_at
 WHERE false;
DROP FUNCTION idempotency.key_counts();
DROP FUNCTION idempotency.outbox_counts();

-- Per scope, the keys COMPLETED, FAILED_RETRYABLE and FAILED_FINAL, and a
-- row with scope NULL for all scopes; no row at all while the counts are not
-- known (on a standby, or not yet recounted since the server started).
-- counted_by: 'commits' or 'scan', the same in every row. The symbol is
-- new in 0.7.0: run while the server still has an older library loaded
-- (installed, not yet restarted), this update stops here and changes
-- nothing, rather than leave the old code to fill rows of this shape.
CREATE FUNCTION idempotency.key_counts(
    OUT scope pg_catalog.text,
    OUT completed pg_catalog.int8,
    OUT failed_retryable pg_catalog.int8,
    OUT failed_final pg_catalog.int8,
    OUT counted_by pg_catalog.text)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_key_counts_with_source';

-- Per topic, the events pending or in flight, of them those handed out at
-- least once, the dead events, and the last delivery (remembered after the
-- delivered events are purged, until the server restarts, while the counts
-- are kept); a row with topic NULL for all topics; no row at all while the
-- counts are not known. counted_by as above.
CREATE FUNCTION idempotency.outbox_counts(
    OUT topic pg_catalog.text,
    OUT undelivered pg_catalog.int8,
    OUT handed_out pg_catalog.int8,
    OUT dead pg_catalog.int8,
    OUT last_delivered_at pg_catalog.timestamptz,
    OUT counted_by pg_catalog.text)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_outbox_counts_with_source';

REVOKE ALL ON FUNCTION idempotency.key_counts(), idempotency.outbox_counts() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.key_counts(), idempotency.outbox_counts() TO pg_monitor;

-- A TRUNCATE of the tables the counts are kept for (a DBA emptying a
-- backlog) removes rows without a change the counts could follow: at its
-- commit the database's counts become unknown and are recounted from the
-- tables, as after idempotency.request_sweep(). It fires also in sessions
-- with session_replication_role = replica, which ordinary triggers skip.
CREATE FUNCTION idempotency.counts_truncated()
RETURNS trigger
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_counts_truncated';
CREATE TRIGGER counts_truncated AFTER TRUNCATE ON idempotency.idempotency_keys
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.counts_truncated();
CREATE TRIGGER counts_truncated AFTER TRUNCATE ON idempotency.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.counts_truncated();
ALTER TABLE idempotency.idempotency_keys ENABLE ALWAYS TRIGGER counts_truncated;
ALTER TABLE idempotency.outbox ENABLE ALWAYS TRIGGER counts_truncated;
REVOKE ALL ON FUNCTION idempotency.counts_truncated() FROM PUBLIC;

-- The drop guard fires in sessions with session_replication_role = replica
-- too (replication tools, restores), which event triggers left at the
-- default skip.
ALTER EVENT TRIGGER idempotency_drop_guard ENABLE ALWAYS;

-- ---------------------------------------------------------------- views

-- As in 0.6.0, and counted_by last.
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
known AS (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 AS yes,
                 COALESCE(pg_catalog.min(c.counted_by), 'unknown') AS counted_by
            FROM counted c
           WHERE c.scope IS NULL)
SELECT COALESCE(l.scope, f.scope) AS scope,
       COALESCE(l.received, 0::pg_catalog.int8) AS received,
       COALESCE(l.processing, 0::pg_catalog.int8) AS processing,
       CASE WHEN k.yes THEN COALESCE(f.completed, 0::pg_catalog.int8) END AS completed,
       CASE WHEN k.yes THEN COALESCE(f.failed_retryable, 0::pg_catalog.int8) END AS failed_retryable,
       CASE WHEN k.yes THEN COALESCE(f.failed_final, 0::pg_catalog.int8) END AS failed_final,
       COALESCE(l.stuck, 0::pg_catalog.int8) AS stuck,
       l.oldest_processing_age,
       k.counted_by
  FROM live l
  FULL JOIN (SELECT * FROM counted c WHERE c.scope IS NOT NULL) f
    ON f.scope OPERATOR(pg_catalog.=) l.scope,
  known k;

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
known AS (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 AS yes,
                 COALESCE(pg_catalog.min(c.counted_by), 'unknown') AS counted_by
            FROM counted c
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
       c.last_delivered_at,
       k.counted_by
  FROM topics c
  FULL JOIN due d ON d.topic OPERATOR(pg_catalog.=) c.topic
  FULL JOIN flying f ON f.topic OPERATOR(pg_catalog.=) COALESCE(c.topic, d.topic),
  n, known k;

-- ---------------------------------------------------------------- roles

-- Roles that read the views execute the new functions, as they executed
-- the old ones (0.6.0 granted them so): readers of outbox_lag
-- outbox_counts(), readers of idem_stats key_counts().
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

-- ---------------------------------------------------------------- tombstones

-- A finished key outlives its result: once the result's retention has
-- passed, the purge moves the key into key_tombstones, kept
-- idempotency.key_retention (or retain_key), and a late duplicate is
-- answered from there (completed or failed, result NULL, result_expired
-- true) instead of running the work again (docs/keys.md#tombstones).
CREATE TABLE idempotency.key_tombstones (
    -- The first 16 bytes of the SHA-256 of the scope's UTF-8 bytes, a zero
    -- byte and the key's UTF-8 bytes (neither can hold a zero byte, so no
    -- two (scope, key) pairs have the same input)
    key_digest  pg_catalog.uuid NOT NULL,
    forget_at   pg_catalog.timestamptz NOT NULL,  -- deleted by the purge after this
    -- The first 4 bytes of the request fingerprint, as a big-endian
    -- integer; NULL: the key had none
    fingerprint pg_catalog.int4,
    status      idempotency.idem_status NOT NULL, -- COMPLETED or FAILED_FINAL
    PRIMARY KEY (key_digest)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);
CREATE INDEX key_tombstones_forget ON idempotency.key_tombstones USING brin (forget_at);
REVOKE ALL ON idempotency.key_tombstones FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.key_tombstones', '');

-- How long a key's tombstone is kept, as its complete or fail asked; and
-- the flag of idem_get's answer from a tombstone (NULL in the table).
ALTER TABLE idempotency.idempotency_keys
    ADD COLUMN key_retention pg_catalog.interval,
    ADD COLUMN result_expired pg_catalog.bool;

-- The answers say when a result is gone because only the key's tombstone
-- is left. An attribute added last: callers that read the columns by name
-- see no change, and the library fills the eight columns of an older
-- version's type.
ALTER TYPE idempotency.idem_outcome ADD ATTRIBUTE result_expired pg_catalog.bool;

-- idem_complete and idem_fail take the retentions per call: retain (the
-- result's; idem_fail gains it) and retain_key (the tombstone's). A
-- function's arguments cannot change in place: the new ones are created
-- beside the old ones, the roles that could execute an old one are given
-- its new one, and then the old ones go.
CREATE FUNCTION idempotency.idem_complete(
    key pg_catalog.text,
    token pg_catalog.int8,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    retain pg_catalog.interval DEFAULT NULL,
    retain_key pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_complete';

CREATE FUNCTION idempotency.idem_fail(
    key pg_catalog.text,
    token pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    retain pg_catalog.interval DEFAULT NULL,
    retain_key pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_status
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_fail';

REVOKE ALL ON FUNCTION
    idempotency.idem_complete(pg_catalog.text, pg_catalog.int8, pg_catalog.jsonb, pg_catalog.text,
                              pg_catalog.interval, pg_catalog.interval),
    idempotency.idem_fail(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.bool,
                          pg_catalog.interval, pg_catalog.text, pg_catalog.interval,
                          pg_catalog.interval)
    FROM PUBLIC;

DO $grant$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role, f.new_signature
          FROM (VALUES ('idempotency.idem_complete(text,bigint,jsonb,text,interval)'::pg_catalog.regprocedure,
                        'idem_complete(text,bigint,jsonb,text,interval,interval)'),
                       ('idempotency.idem_fail(text,bigint,text,boolean,interval,text)'::pg_catalog.regprocedure,
                        'idem_fail(text,bigint,text,boolean,interval,text,interval,interval)'))
               AS f(old, new_signature),
               pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) f.old
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION idempotency.%s TO %s',
                                  granted.new_signature, granted.role);
    END LOOP;
END
$grant$;

DROP FUNCTION idempotency.idem_complete(pg_catalog.text, pg_catalog.int8, pg_catalog.jsonb,
                                        pg_catalog.text, pg_catalog.interval);
DROP FUNCTION idempotency.idem_fail(pg_catalog.text, pg_catalog.int8, pg_catalog.text,
                                    pg_catalog.bool, pg_catalog.interval, pg_catalog.text);

UPDATE idempotency.role_kind_rights
   SET object = 'idem_complete(text,bigint,jsonb,text,interval,interval)'
 WHERE object OPERATOR(pg_catalog.=) 'idem_complete(text,bigint,jsonb,text,interval)';
UPDATE idempotency.role_kind_rights
   SET object = 'idem_fail(text,bigint,text,boolean,interval,text,interval,interval)'
 WHERE object OPERATOR(pg_catalog.=) 'idem_fail(text,bigint,text,boolean,interval,text)';

-- The tombstones of this database, apart from idem_stats' keys (a
-- tombstone keeps no scope): the table's row estimate (NULL before the
-- first VACUUM or ANALYZE) and its size.
-- tombstones: the table's row estimate; before the table's first VACUUM
-- or ANALYZE, 0 while it has no block, unknown (NULL) after.
CREATE VIEW idempotency.idem_tombstones AS
SELECT CASE WHEN c.reltuples OPERATOR(pg_catalog.>=) 0 THEN c.reltuples::pg_catalog.int8
            WHEN pg_catalog.pg_relation_size(c.oid) OPERATOR(pg_catalog.=) 0 THEN 0 END AS tombstones,
       pg_catalog.pg_total_relation_size(c.oid) AS bytes
  FROM pg_catalog.pg_class c
 WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.key_tombstones'::pg_catalog.regclass;
REVOKE ALL ON idempotency.idem_tombstones FROM PUBLIC;
GRANT SELECT ON idempotency.idem_tombstones TO pg_monitor;
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('monitoring', 'idem_tombstones', true);
-- Roles that read idem_stats read it too.
DO $grant$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.idem_stats'::pg_catalog.regclass
           AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON idempotency.idem_tombstones TO %s', granted.role);
    END LOOP;
END
$grant$;

-- ---------------------------------------------------------------- steps

-- Multi-step work: the holder of a key records each finished step
-- (idem_step) in the transaction of the step's own writes, and a later
-- claim returns the steps finished so far, to skip them
-- (docs/keys.md#multi-step-work-resume-after-the-last-finished-step). The
-- steps are a column of the key's row that no index follows, so that
-- recording one is a HOT update; they go with the key.
ALTER TABLE idempotency.idempotency_keys ADD COLUMN steps pg_catalog.jsonb;
ALTER TYPE idempotency.idem_outcome ADD ATTRIBUTE steps pg_catalog.jsonb;

CREATE FUNCTION idempotency.idem_step(
    key pg_catalog.text,
    token pg_catalog.int8,
    step pg_catalog.text,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_step';

CREATE FUNCTION idempotency.idem_step_key(
    key pg_catalog.text,
    step pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.text
LANGUAGE c IMMUTABLE
AS 'MODULE_PATHNAME', 'idem_step_key';

REVOKE ALL ON FUNCTION idempotency.idem_step(pg_catalog.text, pg_catalog.int8, pg_catalog.text,
    pg_catalog.jsonb, pg_catalog.text), idempotency.idem_step_key(pg_catalog.text,
    pg_catalog.text, pg_catalog.text) FROM PUBLIC;
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('application', 'idem_step(text,bigint,text,jsonb,text)', false),
    ('application', 'idem_step_key(text,text,text)', false);

-- Claims that resumed after finished steps are counted in idem_metrics, a
-- column after stats_reset. A function's result columns cannot change in
-- place: the view leaves the function for the moment of the update (same
-- columns, no row; nobody sees this), so that it is replaced, never
-- dropped, and keeps its rights; the function's are given again below to
-- the view's readers, as 0.6.0 gave them.
CREATE OR REPLACE VIEW idempotency.idem_metrics AS
SELECT NULL::pg_catalog.int8 AS claims, NULL::pg_catalog.int8 AS replays,
       NULL::pg_catalog.int8 AS in_progress, NULL::pg_catalog.int8 AS mismatches,
       NULL::pg_catalog.int8 AS completions, NULL::pg_catalog.int8 AS failures_retryable,
       NULL::pg_catalog.int8 AS failures_final, NULL::pg_catalog.int8 AS lease_expirations,
       NULL::pg_catalog.int8 AS late_completions, NULL::pg_catalog.int8 AS stale_tokens,
       NULL::pg_catalog.int8 AS inbox_duplicates, NULL::pg_catalog.int8 AS outbox_enqueued,
       NULL::pg_catalog.int8 AS outbox_deduplicated, NULL::pg_catalog.int8 AS outbox_delivered,
       NULL::pg_catalog.int8 AS outbox_retried, NULL::pg_catalog.int8 AS outbox_dead,
       NULL::pg_catalog.int8 AS locks_acquired, NULL::pg_catalog.int8 AS locks_contended,
       NULL::pg_catalog.int8 AS processing_count, NULL::pg_catalog.int8 AS processing_ms_sum,
       NULL::pg_catalog.int8[] AS processing_ms_buckets,
       NULL::pg_catalog.timestamptz AS stats_reset
 WHERE false;
DROP FUNCTION idempotency.idem_metrics_row();
CREATE FUNCTION idempotency.idem_metrics_row(
    OUT claims pg_catalog.int8,
    OUT replays pg_catalog.int8,
    OUT in_progress pg_catalog.int8,
    OUT mismatches pg_catalog.int8,
    OUT completions pg_catalog.int8,
    OUT failures_retryable pg_catalog.int8,
    OUT failures_final pg_catalog.int8,
    OUT lease_expirations pg_catalog.int8,
    OUT late_completions pg_catalog.int8,
    OUT stale_tokens pg_catalog.int8,
    OUT inbox_duplicates pg_catalog.int8,
    OUT outbox_enqueued pg_catalog.int8,
    OUT outbox_deduplicated pg_catalog.int8,
    OUT outbox_delivered pg_catalog.int8,
    OUT outbox_retried pg_catalog.int8,
    OUT outbox_dead pg_catalog.int8,
    OUT locks_acquired pg_catalog.int8,
    OUT locks_contended pg_catalog.int8,
    OUT processing_count pg_catalog.int8,
    OUT processing_ms_sum pg_catalog.int8,
    OUT processing_ms_buckets pg_catalog.int8[],
    OUT stats_reset pg_catalog.timestamptz,
    -- 0.7.0: claims granted on a key with finished steps
    OUT resumed_takeovers pg_catalog.int8)
RETURNS record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_metrics_row';
REVOKE ALL ON FUNCTION idempotency.idem_metrics_row() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_metrics_row() TO pg_monitor;
CREATE OR REPLACE VIEW idempotency.idem_metrics AS SELECT * FROM idempotency.idem_metrics_row();

-- Roles given a kind's rights before this version get its new functions
-- (the applications idem_step and idem_step_key), and the readers of
-- idem_metrics the function behind it again.
DO $grant$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role, n.function
          FROM (VALUES ('idempotency.idem_complete(pg_catalog.text, pg_catalog.int8, pg_catalog.jsonb, '
                        'pg_catalog.text, pg_catalog.interval, pg_catalog.interval)',
                        'idempotency.idem_step(pg_catalog.text, pg_catalog.int8, pg_catalog.text, '
                        'pg_catalog.jsonb, pg_catalog.text)'),
                       ('idempotency.idem_complete(pg_catalog.text, pg_catalog.int8, pg_catalog.jsonb, '
                        'pg_catalog.text, pg_catalog.interval, pg_catalog.interval)',
                        'idempotency.idem_step_key(pg_catalog.text, pg_catalog.text, pg_catalog.text)'))
               AS n(had, function),
               pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) n.had::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        UNION
        SELECT a.grantee::pg_catalog.regrole, 'idempotency.idem_metrics_row()'
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.idem_metrics'::pg_catalog.regclass
           AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', granted.function, granted.role);
    END LOOP;
END
$grant$;

-- ---------------------------------------------------------------- initial rights

-- The rights given above to the roles that had the old objects' are the
-- roles', as grant_* gives them, not the extension's own. Given in this
-- script, PostgreSQL records them as the extension's initial rights
-- (pg_init_privs), which pg_dump leaves out as CREATE EXTENSION's doing:
-- a restore of a dump of the updated database would lose them. They are
-- taken out of the initial rights, which are left as a fresh install of
-- 0.7.0 has them (its owner's and pg_monitor's): pg_dump writes the roles'
-- as GRANTs.
UPDATE pg_catalog.pg_init_privs ip
   SET initprivs = ARRAY(
           SELECT item FROM pg_catalog.unnest(ip.initprivs) AS item
            WHERE (SELECT a.grantee OPERATOR(pg_catalog.=) a.grantor
                          OR a.grantee OPERATOR(pg_catalog.=) 0
                          OR a.grantee OPERATOR(pg_catalog.=) 'pg_monitor'::pg_catalog.regrole
                     FROM pg_catalog.aclexplode(ARRAY[item]) a LIMIT 1))
 WHERE ip.privtype OPERATOR(pg_catalog.=) 'e'
   AND EXISTS (SELECT FROM pg_catalog.pg_depend d, pg_catalog.pg_extension e
                WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) e.oid
                  AND d.deptype OPERATOR(pg_catalog.=) 'e'
                  AND d.classid OPERATOR(pg_catalog.=) ip.classoid
                  AND d.objid OPERATOR(pg_catalog.=) ip.objoid);
