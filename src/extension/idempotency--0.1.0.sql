-- idempotency extension, version 0.1.0: keys, inbox, resource locks
-- Every object lives in schema idempotency, which CREATE EXTENSION creates.
-- Application functions are SECURITY DEFINER with a pinned search_path, so
-- that a role with USAGE on the schema needs no privilege on the tables.

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
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 70);

-- The consumer-side inbox: one row per message seen.
CREATE TABLE idempotency.inbox (
    source      pg_catalog.text NOT NULL,
    message_id  pg_catalog.text NOT NULL,
    payload     pg_catalog.jsonb,
    received_at pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (source, message_id)
);

-- Resource leases: a row per held (or expired, not yet purged) lock.
CREATE TABLE idempotency.locks (
    resource    pg_catalog.text NOT NULL PRIMARY KEY,
    token       pg_catalog.int8 NOT NULL,
    owner       pg_catalog.text,
    acquired_at pg_catalog.timestamptz NOT NULL,
    expires_at  pg_catalog.timestamptz NOT NULL
) WITH (fillfactor = 70);

REVOKE ALL ON idempotency.idempotency_keys, idempotency.inbox, idempotency.locks FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.token_seq FROM PUBLIC;

-- ---------------------------------------------------------------- key functions

CREATE FUNCTION idempotency.idem_register(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    job_ref pg_catalog.text DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_register';

CREATE FUNCTION idempotency.idem_claim(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    lease pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    wait pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_claim';

CREATE FUNCTION idempotency.idem_complete(
    key pg_catalog.text,
    token pg_catalog.int8,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    retain pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_complete';

CREATE FUNCTION idempotency.idem_fail(
    key pg_catalog.text,
    token pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idem_status
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_fail';

CREATE FUNCTION idempotency.idem_heartbeat(
    key pg_catalog.text,
    token pg_catalog.int8,
    extend pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.timestamptz
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_heartbeat';

CREATE FUNCTION idempotency.idem_release(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_release';

CREATE FUNCTION idempotency.idem_get(
    key pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idempotency_keys
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_get';

CREATE FUNCTION idempotency.idem_assert_owner(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_assert_owner';

-- ---------------------------------------------------------------- inbox

CREATE FUNCTION idempotency.inbox_receive(
    message_id pg_catalog.text,
    source pg_catalog.text DEFAULT 'default',
    payload pg_catalog.jsonb DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'inbox_receive';

-- ---------------------------------------------------------------- resource locks

CREATE FUNCTION idempotency.idem_lock(
    resource pg_catalog.text,
    ttl pg_catalog.interval DEFAULT NULL,
    owner pg_catalog.text DEFAULT NULL,
    wait pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_lock';

CREATE FUNCTION idempotency.idem_lock_renew(
    resource pg_catalog.text,
    token pg_catalog.int8,
    ttl pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_lock_renew';

CREATE FUNCTION idempotency.idem_unlock(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_unlock';

CREATE FUNCTION idempotency.idem_lock_assert(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'idem_lock_assert';

-- ---------------------------------------------------------------- maintenance

CREATE FUNCTION idempotency.idem_maintenance()
RETURNS TABLE (task pg_catalog.text, rows pg_catalog.int8)
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
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

