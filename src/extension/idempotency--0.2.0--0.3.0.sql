-- idempotency 0.2.0 -> 0.3.0: the C functions switch to their owner and pin
-- the search path themselves, instead of SECURITY DEFINER with SET
-- search_path, which cost several microseconds per call; and the sweep
-- indexes of the keys no longer follow a column that complete changes, so
-- that a complete is a HOT update.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- ---------------------------------------------------------------- functions

ALTER FUNCTION idempotency.idem_register(text,jsonb,text,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_claim(text,jsonb,interval,text,interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_complete(text,bigint,jsonb,text,interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_fail(text,bigint,text,boolean,interval,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_heartbeat(text,bigint,interval,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_release(text,bigint,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_get(text,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_assert_owner(text,bigint,text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.inbox_receive(text,text,jsonb) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_lock(text,interval,text,interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_lock_renew(text,bigint,interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_unlock(text,bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_lock_assert(text,bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.idem_maintenance() SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.outbox_enqueue(text,jsonb,text,jsonb,text,timestamp with time zone) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.outbox_claim(text,integer,interval,text[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.outbox_ack(bigint[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.outbox_nack(bigint,text,boolean,interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION idempotency.outbox_redrive(bigint[],text) SECURITY INVOKER RESET search_path;

-- ---------------------------------------------------------------- sweep indexes

-- Keys are filed for retention by purge_at; leases stay indexed until the
-- sweep settles them. Existing keys are settled here, in one pass.
ALTER TABLE idempotency.idempotency_keys ADD COLUMN purge_at pg_catalog.timestamptz;
UPDATE idempotency.idempotency_keys
   SET purge_at = expires_at,
       lease_until = CASE WHEN status = 'PROCESSING' THEN lease_until END
 WHERE expires_at IS NOT NULL OR (lease_until IS NOT NULL AND status <> 'PROCESSING');
DROP INDEX idempotency.idempotency_keys_leases;
DROP INDEX idempotency.idempotency_keys_expiry;
CREATE INDEX idempotency_keys_leases ON idempotency.idempotency_keys (lease_until)
    WHERE lease_until IS NOT NULL;
CREATE INDEX idempotency_keys_purge ON idempotency.idempotency_keys (purge_at)
    WHERE purge_at IS NOT NULL;
