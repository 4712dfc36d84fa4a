-- idempotency 0.5.0 -> 0.6.0: heartbeats and completes are HOT updates.
--
-- active_since: set when a key becomes live (registered, or claimed when it
-- had none), kept while it is RECEIVED or PROCESSING and cleared by the
-- sweep once the key has left those states. No heartbeat and no complete
-- changes it, and no index follows lease_until any more, so both are HOT
-- updates; the lease sweeps and idem_stuck find the live keys through the
-- partial index on it and never read a finished key the sweep has settled.
--
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

