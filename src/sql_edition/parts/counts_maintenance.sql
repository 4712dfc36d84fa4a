-- ---------------------------------------------------------------- counts and metrics
--
-- Without shared memory the counts behind idem_stats and outbox_lag are
-- counted from the tables at each read ('scan'), as the C++ edition does
-- for a database whose counts do not fit in its shared memory. The
-- cumulative counters of idem_metrics need shared memory: NULL here.

-- Per scope, the keys COMPLETED, FAILED_RETRYABLE and FAILED_FINAL, and a
-- row with scope NULL for all scopes.
CREATE FUNCTION idempotency.key_counts(
    OUT scope pg_catalog.text,
    OUT completed pg_catalog.int8,
    OUT failed_retryable pg_catalog.int8,
    OUT failed_final pg_catalog.int8,
    OUT counted_by pg_catalog.text)
RETURNS SETOF record
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
SELECT k.scope, count(*) FILTER (WHERE k.status = 'COMPLETED'),
       count(*) FILTER (WHERE k.status = 'FAILED_RETRYABLE'),
       count(*) FILTER (WHERE k.status = 'FAILED_FINAL'), 'scan'
  FROM idempotency.idempotency_keys k
 WHERE k.status IN ('COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL')
 GROUP BY ROLLUP (k.scope)
$$;

-- Per topic, the events pending or in flight, of them those handed out at
-- least once, the dead events, and the last delivery still kept; a row
-- with topic NULL for all topics.
CREATE FUNCTION idempotency.outbox_counts(
    OUT topic pg_catalog.text,
    OUT undelivered pg_catalog.int8,
    OUT handed_out pg_catalog.int8,
    OUT dead pg_catalog.int8,
    OUT last_delivered_at pg_catalog.timestamptz,
    OUT counted_by pg_catalog.text)
RETURNS SETOF record
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
SELECT o.topic, count(*) FILTER (WHERE o.state IN ('pending', 'in_flight')),
       count(*) FILTER (WHERE o.state IN ('pending', 'in_flight') AND o.attempts > 0),
       count(*) FILTER (WHERE o.state = 'dead'), max(o.delivered_at), 'scan'
  FROM idempotency.outbox o
 GROUP BY ROLLUP (o.topic)
$$;

-- The cumulative counters: kept in shared memory by the C++ edition; none
-- here (every column NULL).
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
    OUT resumed_takeovers pg_catalog.int8)
RETURNS record
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8,
       NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8,
       NULL::int8, NULL::int8, NULL::int8, NULL::int8, NULL::int8[], NULL::timestamptz, NULL::int8
$$;

CREATE FUNCTION idempotency.idem_metrics_reset()
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT $$;

-- The effective idempotency.stuck_after, as an interval. The views call it
-- for their readers, who may not call the settings' helpers: it runs as
-- the owner (the setting is still the reader's session's).
CREATE FUNCTION idempotency.stuck_after()
RETURNS pg_catalog.interval
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.setting_interval('stuck_after', interval '1 ms', interval '5 min') $$;

-- ---------------------------------------------------------------- maintenance
--
-- What the C++ edition's background workers do, as one call: schedule it
-- (pg_cron, or the relay's and the clients' maintenance interval); see
-- docs/managed-postgres.md.

-- One pass of the sweeps in this database, every task until a batch comes
-- back short, in the C++ edition's order and with its task names.
CREATE FUNCTION idempotency.idem_maintenance()
RETURNS TABLE (task pg_catalog.text, rows pg_catalog.int8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    batch int4 := idempotency.setting_int('purge_batch', 10000);
    key_cap int4 := idempotency.setting_int('max_attempts', 5);
    result_retention interval := idempotency.setting_interval('retention', interval '1 s', interval '1 day');
    tombstone_retention interval := idempotency.setting_interval('key_retention', interval '1 s', interval '30 days');
    event_cap int4 := idempotency.setting_int('outbox_max_attempts', 10);
    outbox_retention interval := idempotency.setting_interval('outbox_retention', interval '1 s', interval '1 hour');
    inbox_retention interval := idempotency.setting_interval('inbox_retention', interval '1 s', interval '7 days');
    now timestamptz;
    changed int8;
    total int8;
    subscription name;
BEGIN
    -- Tables a logical replication subscription writes (the new side of an
    -- upgrade by logical replication) are kept by its publisher's
    -- maintenance: a purge here would insert the tombstone that the
    -- publisher's purge sends next, and stop the subscription.
    SELECT s.subname INTO subscription
      FROM pg_catalog.pg_subscription_rel r
      JOIN pg_catalog.pg_subscription s ON s.oid = r.srsubid
     WHERE r.srrelid IN ('idempotency.idempotency_keys'::pg_catalog.regclass,
                         'idempotency.key_tombstones'::pg_catalog.regclass,
                         'idempotency.outbox'::pg_catalog.regclass,
                         'idempotency.inbox'::pg_catalog.regclass,
                         'idempotency.locks'::pg_catalog.regclass)
     LIMIT 1;
    IF subscription IS NOT NULL THEN
        RAISE EXCEPTION 'idem_maintenance(): the extension''s tables in this database are written by subscription "%"', subscription
              USING ERRCODE = '55000',
                    HINT = 'Run it where the subscription''s publisher is; here it changes nothing until the subscription is dropped.';
    END IF;

    -- Leases that ran out: FAILED_RETRYABLE, or FAILED_FINAL when the
    -- attempts its claim allowed are used up.
    task := 'expire_leases'; total := 0;
    LOOP
        now := clock_timestamp();
        WITH due AS (
            SELECT k.ctid FROM idempotency.idempotency_keys k
             WHERE k.status = 'PROCESSING' AND k.lease_until <= now AND k.active_since IS NOT NULL
             ORDER BY k.active_since LIMIT batch FOR NO KEY UPDATE OF k SKIP LOCKED),
        expired AS (
            UPDATE idempotency.idempotency_keys k
               SET status = CASE WHEN k.attempts >= COALESCE(k.max_attempts, key_cap)
                                 THEN 'FAILED_FINAL' ELSE 'FAILED_RETRYABLE' END::idempotency.idem_status,
                   last_error = 'lease expired', lease_expired = true, next_attempt_at = now, updated_at = now,
                   expires_at = CASE WHEN k.attempts >= COALESCE(k.max_attempts, key_cap)
                                     THEN now + COALESCE(k.retention, result_retention) END,
                   holder_pid = NULL
              FROM due WHERE k.ctid = due.ctid AND k.status = 'PROCESSING'
            RETURNING 1)
        SELECT count(*) INTO changed FROM expired;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    -- A claim whose backend has exited (idempotency.expire_on_disconnect).
    task := 'expire_disconnected'; total := 0;
    IF idempotency.setting_bool('expire_on_disconnect', false) THEN
        LOOP
            now := clock_timestamp();
            WITH due AS (
                SELECT k.ctid FROM idempotency.idempotency_keys k
                 WHERE k.status = 'PROCESSING' AND k.holder_pid IS NOT NULL AND k.lease_until > now
                   -- backend_start is NULL for another role's backend unless
                   -- the owner may read all statistics (pg_read_all_stats): a
                   -- live pid then counts as the holder's.
                   AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a
                                    WHERE a.pid = k.holder_pid
                                      AND (a.backend_start IS NULL OR a.backend_start <= k.claimed_at))
                   AND k.active_since IS NOT NULL
                 ORDER BY k.active_since LIMIT batch FOR NO KEY UPDATE OF k SKIP LOCKED),
            expired AS (
                UPDATE idempotency.idempotency_keys k
                   SET status = CASE WHEN k.attempts >= COALESCE(k.max_attempts, key_cap)
                                     THEN 'FAILED_FINAL' ELSE 'FAILED_RETRYABLE' END::idempotency.idem_status,
                       last_error = 'lease expired', lease_expired = true, next_attempt_at = now,
                       updated_at = now,
                       expires_at = CASE WHEN k.attempts >= COALESCE(k.max_attempts, key_cap)
                                         THEN now + COALESCE(k.retention, result_retention) END,
                       holder_pid = NULL
                  FROM due WHERE k.ctid = due.ctid AND k.status = 'PROCESSING'
                RETURNING 1)
            SELECT count(*) INTO changed FROM expired;
            total := total + changed;
            EXIT WHEN changed < batch;
        END LOOP;
    END IF;
    rows := total; RETURN NEXT;

    -- Finished keys leave the live keys' index and are filed for retention.
    task := 'settle_leases'; total := 0;
    LOOP
        WITH due AS (
            SELECT k.ctid FROM idempotency.idempotency_keys k
             WHERE k.active_since IS NOT NULL AND k.status NOT IN ('RECEIVED', 'PROCESSING')
             ORDER BY k.active_since LIMIT batch FOR NO KEY UPDATE SKIP LOCKED),
        settled AS (
            UPDATE idempotency.idempotency_keys k
               SET active_since = NULL, lease_until = NULL, purge_at = k.expires_at
              FROM due WHERE k.ctid = due.ctid AND k.status NOT IN ('RECEIVED', 'PROCESSING')
            RETURNING 1)
        SELECT count(*) INTO changed FROM settled;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    -- Events whose lease ran out: pending again (due now, behind the heads
    -- ready before), or dead when their attempts are used up.
    task := 'expire_outbox_leases'; total := 0;
    LOOP
        now := clock_timestamp();
        WITH due AS (
            SELECT o.id FROM idempotency.outbox o
             WHERE o.state = 'in_flight' AND o.lease_until <= now
             ORDER BY o.lease_until LIMIT batch FOR NO KEY UPDATE SKIP LOCKED),
        expired AS (
            UPDATE idempotency.outbox o
               SET state = CASE WHEN o.attempts >= COALESCE(o.max_attempts, event_cap)
                                THEN 'dead' ELSE 'pending' END::idempotency.outbox_state,
                   available_at = now, lease_until = NULL, last_error = 'lease expired', updated_at = now,
                   ready_at = CASE WHEN o.attempts >= COALESCE(o.max_attempts, event_cap)
                                     OR (o.key IS NOT NULL AND o.ready_at IS NULL) THEN NULL ELSE now END
              FROM due WHERE o.id = due.id AND o.state = 'in_flight'
            RETURNING 1)
        SELECT count(*) INTO changed FROM expired;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    -- A finished key leaves its tombstone, kept from when it finished for
    -- its own key_retention (retain_key) or else idempotency.key_retention,
    -- in the same statement that deletes it: a claim sees the key or its
    -- tombstone, never neither. A tombstone's retention that has already
    -- passed leaves none; a tombstone of the key already there (a row
    -- written behind the functions) is replaced by the newer.
    task := 'purge_keys'; total := 0;
    LOOP
        now := clock_timestamp();
        WITH gone AS (
            DELETE FROM idempotency.idempotency_keys d WHERE d.ctid = ANY (ARRAY(
                SELECT k.ctid FROM idempotency.idempotency_keys k
                 WHERE k.purge_at <= now AND k.expires_at <= now
                 ORDER BY k.purge_at LIMIT batch FOR UPDATE SKIP LOCKED))
            RETURNING d.scope, d.key, d.status, d.fingerprint,
                      COALESCE(d.completed_at, d.updated_at) + COALESCE(d.key_retention, tombstone_retention)
                      AS forget_at),
        kept AS (
            INSERT INTO idempotency.key_tombstones AS s (key_digest, forget_at, fingerprint, status)
            SELECT idempotency.tombstone_digest(g.scope, g.key), g.forget_at,
                   idempotency.fingerprint_prefix(g.fingerprint), g.status
              FROM gone g
             WHERE g.status IN ('COMPLETED', 'FAILED_FINAL') AND g.forget_at > now
            ON CONFLICT (key_digest) DO UPDATE SET forget_at = EXCLUDED.forget_at,
                fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status)
        SELECT count(*) INTO changed FROM gone;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    -- Tombstones past forget_at (found through the block range index on it).
    task := 'purge_tombstones'; total := 0;
    LOOP
        now := clock_timestamp();
        DELETE FROM idempotency.key_tombstones WHERE ctid = ANY (ARRAY(
            SELECT s.ctid FROM idempotency.key_tombstones s WHERE s.forget_at <= now
             LIMIT batch FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS changed = ROW_COUNT;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    task := 'purge_outbox'; total := 0;
    LOOP
        now := clock_timestamp();
        DELETE FROM idempotency.outbox WHERE id = ANY (ARRAY(
            SELECT o.id FROM idempotency.outbox o
             WHERE o.state = 'delivered' AND o.delivered_at <= now - outbox_retention
             LIMIT batch FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS changed = ROW_COUNT;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    task := 'purge_inbox'; total := 0;
    LOOP
        now := clock_timestamp();
        DELETE FROM idempotency.inbox WHERE ctid = ANY (ARRAY(
            SELECT i.ctid FROM idempotency.inbox i WHERE i.received_at <= now - inbox_retention
             ORDER BY i.received_at LIMIT batch FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS changed = ROW_COUNT;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;

    task := 'purge_locks'; total := 0;
    LOOP
        now := clock_timestamp();
        DELETE FROM idempotency.locks WHERE ctid = ANY (ARRAY(
            SELECT l.ctid FROM idempotency.locks l WHERE l.expires_at <= now
             ORDER BY l.expires_at LIMIT batch FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS changed = ROW_COUNT;
        total := total + changed;
        EXIT WHEN changed < batch;
    END LOOP;
    rows := total; RETURN NEXT;
END
$$;

-- Without background workers there is nothing to ask: this repairs at once
-- what a sweep would, the live keys written behind the functions' back
-- without active_since (a restore, a manual UPDATE).
CREATE FUNCTION idempotency.request_sweep()
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
UPDATE idempotency.idempotency_keys SET active_since = COALESCE(claimed_at, updated_at)
 WHERE active_since IS NULL AND status IN ('RECEIVED', 'PROCESSING')
$$;
