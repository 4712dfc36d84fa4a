-- idempotency 0.2.0 -> 0.3.0: the C functions switch to their owner and pin
-- the search path themselves, instead of SECURITY DEFINER with SET
-- search_path, which cost several microseconds per call.

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
