-- idempotency extension, version 0.7.0: the whole schema, for a new install.
-- An install of an older version is brought here by the update scripts
-- beside this one (from 0.1.0's full script: 0.1.0--0.2.0 ... 0.6.0--0.7.0);
-- test/tap/030_install_script.pl proves that both ways end in the same
-- catalog: every object, definition, column position and right.
--
-- Every object lives in schema idempotency, which CREATE EXTENSION creates.
-- The C functions run as their owner and pin the search path themselves
-- (not SECURITY DEFINER, which cost microseconds per call); no function is
-- executable by PUBLIC: the grant_* functions give each kind of role its
-- rights.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- ---------------------------------------------------------------- the schema

-- A schema that another role created first (a database owner can) would let
-- that role rename it and put look-alike objects under the old names: the
-- schema must belong to the extension's owner (or to a superuser, as after a
-- restore by another superuser) and hold nothing yet. The messages are the
-- ones the update to 0.4.0 gives an existing install.
DO $check$
DECLARE
    schema_oid pg_catalog.oid := 'idempotency'::pg_catalog.regnamespace;
    schema_owner pg_catalog.name;
    schema_owner_is_superuser pg_catalog.bool;
    extension_owner pg_catalog.name;
    stranger pg_catalog.text;
BEGIN
    SELECT so.rolname, so.rolsuper, eo.rolname INTO schema_owner, schema_owner_is_superuser, extension_owner
      FROM pg_catalog.pg_namespace n, pg_catalog.pg_extension e, pg_catalog.pg_roles so,
           pg_catalog.pg_roles eo
     WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND e.extname OPERATOR(pg_catalog.=) 'idempotency'
       AND so.oid OPERATOR(pg_catalog.=) n.nspowner AND eo.oid OPERATOR(pg_catalog.=) e.extowner;
    IF schema_owner OPERATOR(pg_catalog.<>) extension_owner AND NOT schema_owner_is_superuser THEN
        RAISE EXCEPTION 'schema idempotency belongs to role %, not to the extension''s owner %',
                        schema_owner, extension_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Install into a schema of your own (drop the existing schema first). '
                         'For an existing install: check what the schema holds, then '
                         'ALTER SCHEMA idempotency OWNER TO ' || pg_catalog.quote_ident(extension_owner)
                         || ' and update again.';
    END IF;
    -- Nothing of the extension exists yet: whatever the schema holds (but
    -- the row and array types of what it holds) is someone else's.
    SELECT pg_catalog.string_agg(pg_catalog.pg_describe_object(c.classid, c.objid, 0), ', ')
      INTO stranger
      FROM (SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, oid FROM pg_catalog.pg_class
             WHERE relnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, oid FROM pg_catalog.pg_proc
             WHERE pronamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, oid FROM pg_catalog.pg_type
             WHERE typnamespace OPERATOR(pg_catalog.=) schema_oid
               AND typrelid OPERATOR(pg_catalog.=) 0 AND typelem OPERATOR(pg_catalog.=) 0
            UNION ALL SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, oid FROM pg_catalog.pg_operator
             WHERE oprnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, oid FROM pg_catalog.pg_collation
             WHERE collnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, oid FROM pg_catalog.pg_conversion
             WHERE connamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, oid FROM pg_catalog.pg_opclass
             WHERE opcnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, oid FROM pg_catalog.pg_opfamily
             WHERE opfnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_config
             WHERE cfgnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_dict
             WHERE dictnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_ts_parser'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_parser
             WHERE prsnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_ts_template'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_template
             WHERE tmplnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, oid FROM pg_catalog.pg_statistic_ext
             WHERE stxnamespace OPERATOR(pg_catalog.=) schema_oid
            UNION ALL SELECT 'pg_catalog.pg_extension'::pg_catalog.regclass, oid FROM pg_catalog.pg_extension
             WHERE extnamespace OPERATOR(pg_catalog.=) schema_oid AND extname OPERATOR(pg_catalog.<>) 'idempotency')
           AS c (classid, objid);
    IF stranger IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency holds objects that are not the extension''s: %', stranger
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'The extension works only in a schema of its own: move or drop those objects first.';
    END IF;
END
$check$;

-- ---------------------------------------------------------------- types

CREATE TYPE idempotency.idem_status AS ENUM
    ('RECEIVED', 'PROCESSING', 'COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL');

-- What the key functions answer.
CREATE TYPE idempotency.idem_outcome AS (
    outcome     pg_catalog.text,
    status      idempotency.idem_status,
    token       pg_catalog.int8,
    attempt     pg_catalog.int4,
    result      pg_catalog.jsonb,
    error       pg_catalog.text,
    retry_after pg_catalog.interval,
    job_ref     pg_catalog.text,
    -- 0.7.0: the key's result has passed its retention and only its
    -- tombstone is left: result is NULL for that reason (docs/keys.md)
    result_expired pg_catalog.bool,
    -- 0.7.0: a claim granted on a key with finished steps: those steps, to
    -- skip (docs/keys.md#multi-step-work-resume-after-the-last-finished-step)
    steps       pg_catalog.jsonb
);

CREATE TYPE idempotency.outbox_state AS ENUM ('pending', 'in_flight', 'delivered', 'dead');

-- An event as outbox_claim hands it out.
CREATE TYPE idempotency.outbox_delivery AS (
    id          pg_catalog.int8,
    topic       pg_catalog.text,
    key         pg_catalog.text,
    payload     pg_catalog.jsonb,
    headers     pg_catalog.jsonb,
    dedup_key   pg_catalog.text,
    attempt     pg_catalog.int4,
    enqueued_at pg_catalog.timestamptz
);

-- Fencing tokens for keys and resource locks: one sequence, so tokens only grow.
CREATE SEQUENCE idempotency.token_seq AS pg_catalog.int8;

-- ---------------------------------------------------------------- tables

-- Columns that later versions added stay last, in the order of their
-- versions, where ALTER TABLE ... ADD COLUMN puts them in an updated
-- install: a new install and an updated one have the same row layout, so
-- SELECT *, idem_get's result and a dump read the same in both.
--
-- Queue-like tables churn: they are vacuumed after 2% of their rows changed
-- instead of the default 20%, so that dead rows do not pile up; a fillfactor
-- leaves room on the page for the updates of a row.

-- One row per (scope, key). Neither sweep index follows a column that a
-- heartbeat or a complete changes, so that both are HOT updates.
CREATE TABLE idempotency.idempotency_keys (
    scope           pg_catalog.text NOT NULL,
    key             pg_catalog.text NOT NULL,
    status          idempotency.idem_status NOT NULL,
    token           pg_catalog.int8,
    attempts        pg_catalog.int4 NOT NULL DEFAULT 0,
    lease_until     pg_catalog.timestamptz,
    next_attempt_at pg_catalog.timestamptz,
    fingerprint     pg_catalog.bytea,
    result          pg_catalog.jsonb,
    last_error      pg_catalog.text,
    job_ref         pg_catalog.text,
    created_at      pg_catalog.timestamptz NOT NULL,
    updated_at      pg_catalog.timestamptz NOT NULL,  -- last change of state
    completed_at    pg_catalog.timestamptz,
    expires_at      pg_catalog.timestamptz,           -- deleted by retention after this
    claimed_at      pg_catalog.timestamptz,           -- when the current token was granted
    registered      pg_catalog.bool NOT NULL DEFAULT false,  -- created by idem_register
    lease_expired   pg_catalog.bool NOT NULL DEFAULT false,  -- the current token's lease ran out
    holder_pid      pg_catalog.int4,                  -- backend that was granted the current token
    -- 0.3.0: filed for retention (set by the sweep once the key has finished)
    purge_at        pg_catalog.timestamptz,
    -- 0.4.0: what the claim's settings decided, for a sweep that expires its
    -- lease later: attempts before a failure is final, and how long the key
    -- is kept once it is. NULL: the server's settings.
    max_attempts    pg_catalog.int4,
    retention       pg_catalog.interval,
    -- 0.6.0: set when the key becomes live (registered, or claimed when it
    -- had none), kept while it is RECEIVED or PROCESSING, cleared by the
    -- sweep once it has left those states
    active_since    pg_catalog.timestamptz,
    -- 0.7.0: how long the key's tombstone is kept from when the key
    -- finished, as its complete or fail asked (retain_key). NULL: the
    -- server's idempotency.key_retention when the purge makes it.
    key_retention   pg_catalog.interval,
    -- 0.7.0: NULL in the table; true in idem_get's answer for a key of
    -- which only the tombstone is left (its result has passed its retention)
    result_expired  pg_catalog.bool,
    -- 0.7.0: the finished steps of multi-step work (idem_step), by name:
    -- {"<step>": {"n": place, "attempt": claim, "result": ...}}. No index
    -- follows it, so that recording a step is a HOT update.
    steps           pg_catalog.jsonb,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

-- The live keys, for the lease sweeps and idem_stuck ...
CREATE INDEX idempotency_keys_active ON idempotency.idempotency_keys (active_since)
    WHERE active_since IS NOT NULL;
-- ... and the finished ones filed for retention, for the purge.
CREATE INDEX idempotency_keys_purge ON idempotency.idempotency_keys (purge_at)
    WHERE purge_at IS NOT NULL;

-- 0.7.0: what is left of a finished key once its result's retention
-- (idempotency.retention, or retain) has passed: enough to answer a late
-- duplicate without running the work again, kept until forget_at
-- (idempotency.key_retention, or retain_key). The purge moves keys here in
-- batches; a claim or register of a key that is absent looks here, one
-- primary-key read. Narrow on purpose (56 bytes a row, no padding: the
-- 16-byte digest first, then the 8-byte time, then the two 4-byte
-- columns); no update ever touches a row. docs/keys.md#tombstones.
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
-- Rows arrive roughly in forget_at order: a block range index finds the
-- ones due for a few bytes per thousand rows, where a B-tree would add an
-- entry to every tombstone.
CREATE INDEX key_tombstones_forget ON idempotency.key_tombstones USING brin (forget_at);

-- The consumer-side inbox: one row per message seen.
CREATE TABLE idempotency.inbox (
    source      pg_catalog.text NOT NULL,
    message_id  pg_catalog.text NOT NULL,
    payload     pg_catalog.jsonb,
    received_at pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (source, message_id)
);
CREATE INDEX inbox_received_at ON idempotency.inbox (received_at);

-- Resource leases: a row per held (or expired, not yet purged) lock.
CREATE TABLE idempotency.locks (
    resource    pg_catalog.text NOT NULL PRIMARY KEY,
    token       pg_catalog.int8 NOT NULL,
    owner       pg_catalog.text,
    acquired_at pg_catalog.timestamptz NOT NULL,
    expires_at  pg_catalog.timestamptz NOT NULL
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);
CREATE INDEX locks_expires_at ON idempotency.locks (expires_at);

-- Events are marked, not moved: pending -> in_flight -> delivered (kept for
-- idempotency.outbox_retention) or dead. docs/outbox.md describes the queue.
CREATE TABLE idempotency.outbox (
    id           pg_catalog.int8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        pg_catalog.text NOT NULL,
    key          pg_catalog.text,
    payload      pg_catalog.jsonb NOT NULL,
    headers      pg_catalog.jsonb,
    dedup_key    pg_catalog.text,
    state        idempotency.outbox_state NOT NULL DEFAULT 'pending',
    attempts     pg_catalog.int4 NOT NULL DEFAULT 0,
    enqueued_at  pg_catalog.timestamptz NOT NULL,
    available_at pg_catalog.timestamptz NOT NULL,  -- due: deliver_at, or after a retry's backoff
    lease_until  pg_catalog.timestamptz,
    relay        pg_catalog.text,                  -- the relay that last claimed it
    last_error   pg_catalog.text,
    delivered_at pg_catalog.timestamptz,
    updated_at   pg_catalog.timestamptz NOT NULL,
    -- 0.4.0: the attempt cap of the session that claimed the event, for the
    -- sweep that expires its lease. NULL: the sweep's own setting.
    max_attempts pg_catalog.int4,
    -- 0.5.0: set on the one event of each (topic, key) that is its key's
    -- head (and on every event without a key): when it may next be handed
    -- out (due, a retry's backoff, or the end of its lease while in flight).
    -- The events waiting behind a head, and finished events, have none.
    ready_at     pg_catalog.timestamptz,
    -- 0.5.0: the event's place in its key's order when it is not its id: an
    -- event whose transaction commits after a later id of its key gets a
    -- place after it; a redriven event gets the place of the head it waits
    -- behind.
    key_seq      pg_catalog.int8
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

CREATE UNIQUE INDEX outbox_dedup ON idempotency.outbox (topic, dedup_key)
    WHERE dedup_key IS NOT NULL;
-- Retention purge of delivered events.
CREATE INDEX outbox_delivered ON idempotency.outbox (delivered_at)
    WHERE state = 'delivered';
-- The ready queue: claims read only the ready events of their topics that
-- are due, oldest first ...
CREATE INDEX outbox_ready ON idempotency.outbox (topic, ready_at, id)
    WHERE ready_at IS NOT NULL;
-- ... or of every topic.
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
CREATE INDEX outbox_in_flight ON idempotency.outbox (lease_until)
    WHERE state = 'in_flight';

-- The topics each relay role may claim, ack, nack, release, redrive and
-- discard; NULL topics: every topic. A role with no row here and the right
-- to execute the relay functions (granted by hand) is not limited.
CREATE TABLE idempotency.relay_grants (
    role   pg_catalog.regrole PRIMARY KEY,
    topics pg_catalog.text[]
);

-- The functions and views of each kind of role (filled under "rights").
CREATE TABLE idempotency.role_kind_rights (
    kind pg_catalog.text NOT NULL,
    object pg_catalog.text NOT NULL,   -- a function's signature, or a view's name
    is_view pg_catalog.bool NOT NULL,
    PRIMARY KEY (kind, object)
);

-- ---------------------------------------------------------------- key functions

CREATE FUNCTION idempotency.idem_register(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    job_ref pg_catalog.text DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_register';

CREATE FUNCTION idempotency.idem_claim(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    lease pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    wait pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_claim';

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

CREATE FUNCTION idempotency.idem_heartbeat(
    key pg_catalog.text,
    token pg_catalog.int8,
    extend pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.timestamptz
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_heartbeat';

CREATE FUNCTION idempotency.idem_release(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_release';

CREATE FUNCTION idempotency.idem_get(
    key pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idempotency_keys
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_get';

-- 0.7.0: multi-step work. The holder records each finished step in the
-- transaction of the step's own writes; a later claim returns the steps
-- finished so far (docs/keys.md).
CREATE FUNCTION idempotency.idem_step(
    key pg_catalog.text,
    token pg_catalog.int8,
    step pg_catalog.text,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.int4
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_step';

-- The key to give a step's external call as the provider's idempotency
-- key: the same at every attempt of the work.
CREATE FUNCTION idempotency.idem_step_key(
    key pg_catalog.text,
    step pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.text
LANGUAGE c IMMUTABLE
AS 'MODULE_PATHNAME', 'idem_step_key';

CREATE FUNCTION idempotency.idem_assert_owner(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_assert_owner';

-- ---------------------------------------------------------------- inbox

CREATE FUNCTION idempotency.inbox_receive(
    message_id pg_catalog.text,
    source pg_catalog.text DEFAULT 'default',
    payload pg_catalog.jsonb DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'inbox_receive';

-- ---------------------------------------------------------------- resource locks

CREATE FUNCTION idempotency.idem_lock(
    resource pg_catalog.text,
    ttl pg_catalog.interval DEFAULT NULL,
    owner pg_catalog.text DEFAULT NULL,
    wait pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_lock';

CREATE FUNCTION idempotency.idem_lock_renew(
    resource pg_catalog.text,
    token pg_catalog.int8,
    ttl pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_lock_renew';

CREATE FUNCTION idempotency.idem_unlock(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_unlock';

CREATE FUNCTION idempotency.idem_lock_assert(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_lock_assert';

-- ---------------------------------------------------------------- outbox

CREATE FUNCTION idempotency.outbox_enqueue(
    topic pg_catalog.text,
    payload pg_catalog.jsonb,
    key pg_catalog.text DEFAULT NULL,
    headers pg_catalog.jsonb DEFAULT NULL,
    dedup_key pg_catalog.text DEFAULT NULL,
    deliver_at pg_catalog.timestamptz DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_enqueue';

CREATE FUNCTION idempotency.outbox_claim(
    relay pg_catalog.text,
    batch pg_catalog.int4 DEFAULT 100,
    lease pg_catalog.interval DEFAULT NULL,
    topics pg_catalog.text[] DEFAULT NULL)
RETURNS SETOF idempotency.outbox_delivery
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_claim';

CREATE FUNCTION idempotency.outbox_ack(ids pg_catalog.int8[])
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_ack';

CREATE FUNCTION idempotency.outbox_nack(
    id pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.outbox_state
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_nack';

-- Events in flight that `relay` claimed go back to pending at once, their
-- attempt not counted: for a relay that will not deliver them in time.
CREATE FUNCTION idempotency.outbox_release(
    ids pg_catalog.int8[],
    relay pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_release';

CREATE FUNCTION idempotency.outbox_redrive(
    ids pg_catalog.int8[] DEFAULT NULL,
    topic pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_redrive';

-- Dead events an operator gives up on: deleted, and the next event of each
-- key they held back becomes its head.
CREATE FUNCTION idempotency.outbox_discard(ids pg_catalog.int8[])
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_discard';

-- ---------------------------------------------------------------- counts and metrics

-- The counts behind idem_stats and outbox_lag, kept in shared memory by
-- committing transactions and recounted from the tables after a server
-- start; a database whose counts do not fit there (idempotency.max_gauges)
-- is counted from its tables at each read. counted_by says which:
-- 'commits' or 'scan', the same in every row. The symbols are new in
-- 0.7.0: run while the server still has an older library loaded
-- (installed, not yet restarted), CREATE EXTENSION stops here.

-- Per scope, the keys COMPLETED, FAILED_RETRYABLE and FAILED_FINAL, and a
-- row with scope NULL for all scopes; no row at all while the counts are not
-- known (on a standby, or not yet recounted since the server started).
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
-- counts are not known.
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

-- Cumulative counters kept in shared memory (needs shared_preload_libraries).
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

CREATE FUNCTION idempotency.idem_metrics_reset()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_metrics_reset';

-- The effective idempotency.stuck_after, as an interval (loads the module so
-- that the setting exists even in a session that has not called it yet).
CREATE FUNCTION idempotency.stuck_after()
RETURNS pg_catalog.interval
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'idem_stuck_after';

-- ---------------------------------------------------------------- maintenance

-- One pass of the sweeps in this database, as the background workers run it.
CREATE FUNCTION idempotency.idem_maintenance()
RETURNS TABLE (task pg_catalog.text, rows pg_catalog.int8)
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_maintenance';

-- Asks the background workers (library preloaded) to sweep this database
-- soon, whatever its due times say: after rows were written to the
-- extension's tables other than through its functions (a restore, a manual
-- UPDATE).
CREATE FUNCTION idempotency.request_sweep()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_request_sweep';

-- Raises a C++ exception of the given kind inside the module, to prove that
-- the boundary turns it into a clean SQL error. For tests.
CREATE FUNCTION idempotency.boundary_selftest(kind pg_catalog.text)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_boundary_selftest';

-- ---------------------------------------------------------------- drop guard

-- DROP EXTENSION (or DROP SCHEMA ... CASCADE, DROP OWNED) is refused while
-- the outbox holds undelivered events or keys are PROCESSING, unless
-- idempotency.force_drop is on; and always inside a transaction that holds
-- outbox claims it has not written yet.
CREATE FUNCTION idempotency.drop_guard()
RETURNS event_trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_drop_guard';

CREATE EVENT TRIGGER idempotency_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION idempotency.drop_guard();
-- Also in sessions with session_replication_role = replica (replication
-- tools, restores), which event triggers left at the default skip.
ALTER EVENT TRIGGER idempotency_drop_guard ENABLE ALWAYS;

-- ---------------------------------------------------------------- roles

-- The functions and views of a kind of role (application, relay,
-- monitoring, admin), from role_kind_rights.
CREATE FUNCTION idempotency.role_rights(kind pg_catalog.text,
    OUT functions pg_catalog.text[], OUT views pg_catalog.text[])
LANGUAGE sql STABLE
AS $$
SELECT pg_catalog.array_agg(r.object ORDER BY r.object) FILTER (WHERE NOT r.is_view),  -- NULL: no such kind
       COALESCE(pg_catalog.array_agg(r.object ORDER BY r.object) FILTER (WHERE r.is_view),
                '{}'::pg_catalog.text[])
  FROM idempotency.role_kind_rights r
 WHERE r.kind OPERATOR(pg_catalog.=) role_rights.kind
$$;

-- Grants (or, with revoke, takes back) the rights of one kind of role.
CREATE FUNCTION idempotency.set_role_rights(role pg_catalog.regrole, kind pg_catalog.text,
                                            take_back pg_catalog.bool)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    rights record;
    object pg_catalog.text;
BEGIN
    SELECT * INTO rights FROM idempotency.role_rights(kind);
    IF rights.functions IS NULL THEN
        RAISE EXCEPTION 'unknown kind of role "%"', kind USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH object IN ARRAY rights.functions LOOP
        EXECUTE format(CASE WHEN take_back THEN 'REVOKE EXECUTE ON FUNCTION idempotency.%s FROM %s'
                            ELSE 'GRANT EXECUTE ON FUNCTION idempotency.%s TO %s' END, object, role);
    END LOOP;
    FOREACH object IN ARRAY rights.views LOOP
        EXECUTE format(CASE WHEN take_back THEN 'REVOKE SELECT ON idempotency.%I FROM %s'
                            ELSE 'GRANT SELECT ON idempotency.%I TO %s' END, object, role);
    END LOOP;
    IF NOT take_back THEN
        EXECUTE format('GRANT USAGE ON SCHEMA idempotency TO %s', role);
    END IF;
END
$$;

-- Keys, inbox, resource locks and outbox_enqueue: what services need.
CREATE FUNCTION idempotency.grant_application(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$ SELECT idempotency.set_role_rights(role, 'application', false) $$;

-- Claim, ack, nack, release and redrive the events of `topics` (NULL: every
-- topic); granting again replaces the topics.
CREATE FUNCTION idempotency.grant_relay(role pg_catalog.regrole,
                                        topics pg_catalog.text[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    IF topics IS NOT NULL AND (pg_catalog.array_position(topics, NULL) IS NOT NULL
                               OR pg_catalog.cardinality(topics) = 0) THEN
        RAISE EXCEPTION 'topics must be NULL (every topic) or a non-empty list without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM idempotency.set_role_rights(role, 'relay', false);
    INSERT INTO idempotency.relay_grants AS g (role, topics) VALUES (role, topics)
        ON CONFLICT ON CONSTRAINT relay_grants_pkey DO UPDATE SET topics = excluded.topics;
END
$$;

-- The views and idem_metrics.
CREATE FUNCTION idempotency.grant_monitoring(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$ SELECT idempotency.set_role_rights(role, 'monitoring', false) $$;

-- Everything: the other three kinds, idem_maintenance and idem_metrics_reset.
CREATE FUNCTION idempotency.grant_admin(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$
SELECT idempotency.set_role_rights(role, 'application', false);
SELECT idempotency.grant_relay(role, NULL);
SELECT idempotency.set_role_rights(role, 'monitoring', false);
SELECT idempotency.set_role_rights(role, 'admin', false);
$$;

-- Takes back every right the grant_* functions gave the role.
CREATE FUNCTION idempotency.revoke_role(role pg_catalog.regrole)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
DECLARE
    kind pg_catalog.text;
BEGIN
    FOREACH kind IN ARRAY ARRAY['application', 'relay', 'monitoring', 'admin'] LOOP
        PERFORM idempotency.set_role_rights(role, kind, true);
    END LOOP;
    DELETE FROM idempotency.relay_grants g WHERE g.role = revoke_role.role;
    EXECUTE format('REVOKE USAGE ON SCHEMA idempotency FROM %s', role);
END
$$;

-- ---------------------------------------------------------------- views

-- "Now" is taken once per query (a materialized CTE or a subquery): a
-- volatile expression in the join would be re-evaluated per row.

-- Only live keys (through idempotency_keys_active) can be stuck.
CREATE VIEW idempotency.idem_stuck AS
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
-- ones come from key_counts(): NULL while it does not know them; counted_by
-- says how they were had.
CREATE VIEW idempotency.idem_stats AS
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

-- Counts from outbox_counts() and the events in flight (outbox_in_flight);
-- the lag from the head of each topic's ready queue (outbox_ready, one
-- step per topic): since when the event that has waited longest to be
-- handed out has been due. pending + in_flight + retrying = undelivered.
CREATE VIEW idempotency.outbox_lag AS
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

CREATE VIEW idempotency.outbox_dead_letters AS
SELECT o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts, o.last_error,
       o.enqueued_at, o.updated_at AS died_at
  FROM idempotency.outbox o
 WHERE o.state OPERATOR(pg_catalog.=) 'dead';

-- Cumulative counters (idem_metrics_row).
CREATE VIEW idempotency.idem_metrics AS SELECT * FROM idempotency.idem_metrics_row();

-- 0.7.0: the tombstones of this database, apart from idem_stats' keys (a
-- tombstone keeps no scope). tombstones is the table's row estimate, kept
-- by VACUUM and ANALYZE (autovacuum, and purge_tombstones after a large
-- batch): NULL before the first; counting the rows would read the whole
-- table.
-- tombstones: the table's row estimate; before the table's first VACUUM
-- or ANALYZE, 0 while it has no block, unknown (NULL) after.
CREATE VIEW idempotency.idem_tombstones AS
SELECT CASE WHEN c.reltuples OPERATOR(pg_catalog.>=) 0 THEN c.reltuples::pg_catalog.int8
            WHEN pg_catalog.pg_relation_size(c.oid) OPERATOR(pg_catalog.=) 0 THEN 0 END AS tombstones,
       pg_catalog.pg_total_relation_size(c.oid) AS bytes
  FROM pg_catalog.pg_class c
 WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.key_tombstones'::pg_catalog.regclass;

-- ---------------------------------------------------------------- rights

-- Nothing is PUBLIC's: the tables are reached through the functions, and
-- the functions are given to roles by kind (the grant_* functions).
REVOKE ALL ON idempotency.idempotency_keys, idempotency.inbox, idempotency.locks,
    idempotency.outbox, idempotency.relay_grants, idempotency.role_kind_rights,
    idempotency.key_tombstones FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.token_seq FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idempotency FROM PUBLIC;
REVOKE ALL ON idempotency.idem_stuck, idempotency.idem_stats, idempotency.outbox_lag,
    idempotency.outbox_dead_letters, idempotency.idem_metrics, idempotency.idem_tombstones
    FROM PUBLIC;

-- Members of pg_monitor read the views and metrics without any other grant.
GRANT USAGE ON SCHEMA idempotency TO pg_monitor;
GRANT SELECT ON idempotency.idem_stuck, idempotency.idem_stats, idempotency.outbox_lag,
    idempotency.outbox_dead_letters, idempotency.idem_metrics, idempotency.idem_tombstones
    TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.stuck_after(), idempotency.idem_metrics_row(),
    idempotency.key_counts(), idempotency.outbox_counts() TO pg_monitor;

-- What each kind of role is given. Relays also read the counts behind
-- outbox_lag; admins get everything (grant_admin gives the other three kinds
-- as well).
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('application', 'idem_register(text,jsonb,text,text)', false),
    ('application', 'idem_claim(text,jsonb,interval,text,interval)', false),
    ('application', 'idem_complete(text,bigint,jsonb,text,interval,interval)', false),
    ('application', 'idem_fail(text,bigint,text,boolean,interval,text,interval,interval)', false),
    ('application', 'idem_heartbeat(text,bigint,interval,text)', false),
    ('application', 'idem_release(text,bigint,text)', false),
    ('application', 'idem_get(text,text)', false),
    ('application', 'idem_assert_owner(text,bigint,text)', false),
    ('application', 'idem_step(text,bigint,text,jsonb,text)', false),
    ('application', 'idem_step_key(text,text,text)', false),
    ('application', 'inbox_receive(text,text,jsonb)', false),
    ('application', 'idem_lock(text,interval,text,interval)', false),
    ('application', 'idem_lock_renew(text,bigint,interval)', false),
    ('application', 'idem_unlock(text,bigint)', false),
    ('application', 'idem_lock_assert(text,bigint)', false),
    ('application', 'outbox_enqueue(text,jsonb,text,jsonb,text,timestamp with time zone)', false),
    ('relay', 'outbox_claim(text,integer,interval,text[])', false),
    ('relay', 'outbox_ack(bigint[])', false),
    ('relay', 'outbox_nack(bigint,text,boolean,interval)', false),
    ('relay', 'outbox_release(bigint[],text)', false),
    ('relay', 'outbox_redrive(bigint[],text)', false),
    ('relay', 'outbox_discard(bigint[])', false),
    ('relay', 'outbox_counts()', false),
    ('relay', 'stuck_after()', false),
    ('relay', 'outbox_lag', true),
    ('monitoring', 'idem_metrics_row()', false),
    ('monitoring', 'key_counts()', false),
    ('monitoring', 'outbox_counts()', false),
    ('monitoring', 'stuck_after()', false),
    ('monitoring', 'idem_stats', true),
    ('monitoring', 'idem_tombstones', true),
    ('monitoring', 'idem_stuck', true),
    ('monitoring', 'outbox_lag', true),
    ('monitoring', 'outbox_dead_letters', true),
    ('monitoring', 'idem_metrics', true),
    ('admin', 'idem_maintenance()', false),
    ('admin', 'idem_metrics_reset()', false),
    ('admin', 'request_sweep()', false);

-- ---------------------------------------------------------------- backups

-- pg_dump writes the rows of these tables and the values of the sequences,
-- so that a restore keeps every key, result, event, inbox row, lock and
-- grant, and new tokens and event ids continue above the old ones.
SELECT pg_catalog.pg_extension_config_dump('idempotency.idempotency_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.locks', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.relay_grants', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.token_seq', '');
SELECT pg_catalog.pg_extension_config_dump(
    pg_catalog.pg_get_serial_sequence('idempotency.outbox', 'id')::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.key_tombstones', '');
