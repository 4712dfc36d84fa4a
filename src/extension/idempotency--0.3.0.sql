-- idempotency extension, version 0.3.0
-- Every object lives in schema idempotency, which CREATE EXTENSION creates.
-- The C functions run as their owner with the search path pinned to
-- pg_catalog (switched in C, which costs less per call than SECURITY DEFINER
-- with SET search_path), so a role with USAGE on the schema needs no
-- privilege on the tables.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- ---------------------------------------------------------------- types

CREATE TYPE idempotency.idem_status AS ENUM
    ('RECEIVED', 'PROCESSING', 'COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL');

CREATE TYPE idempotency.idem_outcome AS (
    outcome     pg_catalog.text,
    status      idempotency.idem_status,
    token       pg_catalog.int8,
    attempt     pg_catalog.int4,
    result      pg_catalog.jsonb,
    error       pg_catalog.text,
    retry_after pg_catalog.interval,
    job_ref     pg_catalog.text
);

-- Fencing tokens for keys and resource locks: one sequence, so tokens only grow.
CREATE SEQUENCE idempotency.token_seq AS pg_catalog.int8;

-- ---------------------------------------------------------------- tables

-- Queue-like tables churn: vacuum them after 2% of their rows changed
-- instead of the default 20%, so that dead rows do not pile up.
-- One row per (scope, key); fillfactor leaves room on the page for updates.
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
    purge_at        pg_catalog.timestamptz,           -- when the retention sweep looks at the key
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

-- The sweeps find what is due through these partial indexes instead of
-- scanning the table: leases not yet settled, and keys filed for retention.
-- Neither changes when a key completes (complete leaves lease_until, and the
-- sweep moves the key from the first index to the second once the lease has
-- ended), so a complete is a HOT update; a sweep's cost follows the rows due,
-- not the table's size.
CREATE INDEX idempotency_keys_leases ON idempotency.idempotency_keys (lease_until)
    WHERE lease_until IS NOT NULL;
CREATE INDEX idempotency_keys_purge ON idempotency.idempotency_keys (purge_at)
    WHERE purge_at IS NOT NULL;

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

REVOKE ALL ON idempotency.idempotency_keys, idempotency.inbox, idempotency.locks FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.token_seq FROM PUBLIC;

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
    retain pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_complete';

CREATE FUNCTION idempotency.idem_fail(
    key pg_catalog.text,
    token pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
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

-- ---------------------------------------------------------------- maintenance

CREATE FUNCTION idempotency.idem_maintenance()
RETURNS TABLE (task pg_catalog.text, rows pg_catalog.int8)
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_maintenance';
REVOKE ALL ON FUNCTION idempotency.idem_maintenance() FROM PUBLIC;

-- Raises a C++ exception of the given kind inside the module, to prove that
-- the boundary turns it into a clean SQL error. For tests; not for PUBLIC.
CREATE FUNCTION idempotency.boundary_selftest(kind pg_catalog.text)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_boundary_selftest';
REVOKE ALL ON FUNCTION idempotency.boundary_selftest(pg_catalog.text) FROM PUBLIC;

-- The effective idempotency.stuck_after, as an interval (loads the module so
-- that the setting exists even in a session that has not called it yet).
CREATE FUNCTION idempotency.stuck_after()
RETURNS pg_catalog.interval
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'idem_stuck_after';

-- ---------------------------------------------------------------- views

CREATE VIEW idempotency.idem_stuck AS
SELECT k.scope, k.key, k.status, k.token, k.attempts, k.lease_until, k.job_ref,
       k.holder_pid, k.created_at, k.updated_at,
       n.now OPERATOR(pg_catalog.-) k.updated_at AS stuck_for
  FROM idempotency.idempotency_keys k,
       (SELECT c.now, c.now OPERATOR(pg_catalog.-) idempotency.stuck_after() AS stuck_before
          FROM (SELECT pg_catalog.clock_timestamp() AS now) c) n
 WHERE (k.status OPERATOR(pg_catalog.=) 'PROCESSING'
        AND (k.lease_until OPERATOR(pg_catalog.<) n.now
             OR k.updated_at OPERATOR(pg_catalog.<) n.stuck_before))
    OR (k.status OPERATOR(pg_catalog.=) 'RECEIVED'
        AND k.updated_at OPERATOR(pg_catalog.<) n.stuck_before);

-- "now" is taken once per query (a materialized CTE): a volatile subquery in
-- the join would be re-evaluated per row and split the groups of a scope.
CREATE VIEW idempotency.idem_stats AS
WITH n AS MATERIALIZED (
    SELECT c.now, c.now OPERATOR(pg_catalog.-) idempotency.stuck_after() AS stuck_before
      FROM (SELECT pg_catalog.clock_timestamp() AS now) c)
SELECT k.scope,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'RECEIVED') AS received,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'PROCESSING') AS processing,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'COMPLETED') AS completed,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'FAILED_RETRYABLE') AS failed_retryable,
       pg_catalog.count(*) FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'FAILED_FINAL') AS failed_final,
       pg_catalog.count(*) FILTER (WHERE
           (k.status OPERATOR(pg_catalog.=) 'PROCESSING'
            AND (k.lease_until OPERATOR(pg_catalog.<) n.now
                 OR k.updated_at OPERATOR(pg_catalog.<) n.stuck_before))
        OR (k.status OPERATOR(pg_catalog.=) 'RECEIVED'
            AND k.updated_at OPERATOR(pg_catalog.<) n.stuck_before)) AS stuck,
       n.now OPERATOR(pg_catalog.-) pg_catalog.min(k.updated_at)
           FILTER (WHERE k.status OPERATOR(pg_catalog.=) 'PROCESSING') AS oldest_processing_age
  FROM idempotency.idempotency_keys k, n
 GROUP BY k.scope, n.now;

REVOKE ALL ON idempotency.idem_stuck, idempotency.idem_stats FROM PUBLIC;
GRANT SELECT ON idempotency.idem_stuck, idempotency.idem_stats TO pg_monitor;
-- Members of pg_monitor read the views without any other grant.
GRANT USAGE ON SCHEMA idempotency TO pg_monitor;

-- ---------------------------------------------------------------- transactional outbox

CREATE TYPE idempotency.outbox_state AS ENUM ('pending', 'in_flight', 'delivered', 'dead');

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

-- Events are marked, not moved: pending -> in_flight -> delivered (kept for
-- idempotency.outbox_retention) or dead. The partial indexes cover only the
-- live part of the queue, so a claim never walks delivered history.
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
    updated_at   pg_catalog.timestamptz NOT NULL
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

-- Claims scan the live queue in id (enqueue) order.
CREATE INDEX outbox_live ON idempotency.outbox (id)
    WHERE state IN ('pending', 'in_flight');
-- Per-key order: the earlier live events of a (topic, key) ...
CREATE INDEX outbox_key_chain ON idempotency.outbox (topic, key, id)
    WHERE state IN ('pending', 'in_flight') AND key IS NOT NULL;
-- ... and whether one of them is in flight; also the lease-expiry scan.
CREATE INDEX outbox_in_flight ON idempotency.outbox (topic, key, lease_until)
    WHERE state = 'in_flight';
CREATE UNIQUE INDEX outbox_dedup ON idempotency.outbox (topic, dedup_key)
    WHERE dedup_key IS NOT NULL;
-- Retention purge of delivered events.
CREATE INDEX outbox_delivered ON idempotency.outbox (delivered_at)
    WHERE state = 'delivered';

REVOKE ALL ON idempotency.outbox FROM PUBLIC;

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

CREATE FUNCTION idempotency.outbox_redrive(
    ids pg_catalog.int8[] DEFAULT NULL,
    topic pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_redrive';
REVOKE ALL ON FUNCTION idempotency.outbox_redrive(pg_catalog.int8[], pg_catalog.text) FROM PUBLIC;

-- Every undelivered, not dead event is in exactly one of pending (never
-- failed, not in flight), in_flight (lease alive) and retrying (failed at
-- least once, or its lease ran out).
CREATE VIEW idempotency.outbox_lag AS
WITH n AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS now)  -- one clock reading
SELECT o.topic,
       pg_catalog.count(*) FILTER (WHERE o.state OPERATOR(pg_catalog.=) 'pending'
                                     AND o.attempts OPERATOR(pg_catalog.=) 0) AS pending,
       pg_catalog.count(*) FILTER (WHERE o.state OPERATOR(pg_catalog.=) 'in_flight'
                                     AND o.lease_until OPERATOR(pg_catalog.>) n.now) AS in_flight,
       pg_catalog.count(*) FILTER (WHERE (o.state OPERATOR(pg_catalog.=) 'pending'
                                          AND o.attempts OPERATOR(pg_catalog.>) 0)
                                      OR (o.state OPERATOR(pg_catalog.=) 'in_flight'
                                          AND o.lease_until OPERATOR(pg_catalog.<=) n.now)) AS retrying,
       pg_catalog.count(*) FILTER (WHERE o.state OPERATOR(pg_catalog.=) 'dead') AS dead,
       pg_catalog.min(o.enqueued_at) FILTER (WHERE o.state OPERATOR(pg_catalog.=) ANY
                                             ('{pending,in_flight}')) AS oldest_pending_at,
       COALESCE(n.now OPERATOR(pg_catalog.-) pg_catalog.min(o.enqueued_at) FILTER (
                    WHERE o.state OPERATOR(pg_catalog.=) ANY ('{pending,in_flight}')),
                '0'::pg_catalog.interval) AS lag,
       pg_catalog.max(o.delivered_at) AS last_delivered_at
  FROM idempotency.outbox o, n
 GROUP BY o.topic, n.now;

CREATE VIEW idempotency.outbox_dead_letters AS
SELECT o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts, o.last_error,
       o.enqueued_at, o.updated_at AS died_at
  FROM idempotency.outbox o
 WHERE o.state OPERATOR(pg_catalog.=) 'dead';

REVOKE ALL ON idempotency.outbox_lag, idempotency.outbox_dead_letters FROM PUBLIC;
GRANT SELECT ON idempotency.outbox_lag, idempotency.outbox_dead_letters TO pg_monitor;

-- ---------------------------------------------------------------- metrics

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
    OUT stats_reset pg_catalog.timestamptz)
RETURNS record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_metrics_row';

CREATE VIEW idempotency.idem_metrics AS SELECT * FROM idempotency.idem_metrics_row();

CREATE FUNCTION idempotency.idem_metrics_reset()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_metrics_reset';

REVOKE ALL ON FUNCTION idempotency.idem_metrics_row() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.idem_metrics_row() TO pg_monitor;
REVOKE ALL ON FUNCTION idempotency.idem_metrics_reset() FROM PUBLIC;
REVOKE ALL ON idempotency.idem_metrics FROM PUBLIC;
GRANT SELECT ON idempotency.idem_metrics TO pg_monitor;
