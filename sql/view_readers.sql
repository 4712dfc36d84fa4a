-- The views read by the roles the docs give them to: grant_monitoring,
-- pg_monitor, grant_admin, and a relay for outbox_lag. Each reads every view
-- it may while keys are in the states the views look at (a PROCESSING key
-- with a live lease and one whose lease ran out, a RECEIVED key, finished
-- keys) and events are pending: a helper that only the owner may call must
-- not stand between a reader and a view.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE ROLE regress_view_monitor;
CREATE ROLE regress_view_pgmon;
CREATE ROLE regress_view_admin;
CREATE ROLE regress_view_relay;
SELECT idempotency.grant_monitoring('regress_view_monitor');
SELECT idempotency.grant_admin('regress_view_admin');
SELECT idempotency.grant_relay('regress_view_relay');
GRANT pg_monitor TO regress_view_pgmon;

SELECT outcome FROM idempotency.idem_claim('view-live', lease => interval '1 hour', scope => 'view');
SELECT outcome FROM idempotency.idem_claim('view-lapsed', lease => interval '1 ms', scope => 'view');
SELECT outcome FROM idempotency.idem_register('view-received', scope => 'view');
SELECT outcome FROM idempotency.idem_claim('view-done', scope => 'view');
SELECT outcome FROM idempotency.idem_complete('view-done',
    (SELECT token FROM idempotency.idem_get('view-done', 'view')), '{"ok": true}', scope => 'view');
SELECT outcome FROM idempotency.idem_claim('view-failed', scope => 'view');
SELECT idempotency.idem_fail('view-failed',
    (SELECT token FROM idempotency.idem_get('view-failed', 'view')), 'no', retryable => false, scope => 'view');
SELECT pg_sleep(0.01);
SELECT count(*) > 0 AS enqueued FROM (
    SELECT idempotency.outbox_enqueue('view.topic', '{}', key) FROM unnest(ARRAY['a', 'b', NULL]) key) e;

-- Each role reads the views it may, twice: once as its session's first
-- call, and after a setting of its own session that the views use.
CREATE FUNCTION pg_temp.read_views(views text[]) RETURNS TABLE (view text, readable text)
LANGUAGE plpgsql AS $f$
DECLARE
    v text;
BEGIN
    FOREACH v IN ARRAY views LOOP
        view := v;
        BEGIN
            EXECUTE format('SELECT count(*) FROM idempotency.%I', v);
            readable := 'ok';
        EXCEPTION WHEN OTHERS THEN
            readable := SQLSTATE || ': ' || SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END $f$;
GRANT EXECUTE ON FUNCTION pg_temp.read_views(text[]) TO PUBLIC;

SET ROLE regress_view_monitor;
SELECT * FROM pg_temp.read_views('{idem_stats,idem_stuck,idem_metrics,idem_tombstones,outbox_lag,outbox_dead_letters}');
SET idempotency.stuck_after = '1 ms';
SELECT * FROM pg_temp.read_views('{idem_stats,idem_stuck}');
RESET idempotency.stuck_after;
RESET ROLE;
SET ROLE regress_view_pgmon;
SELECT * FROM pg_temp.read_views('{idem_stats,idem_stuck,idem_metrics,idem_tombstones,outbox_lag,outbox_dead_letters}');
RESET ROLE;
SET ROLE regress_view_admin;
SELECT * FROM pg_temp.read_views('{idem_stats,idem_stuck,idem_metrics,idem_tombstones,outbox_lag,outbox_dead_letters}');
RESET ROLE;
SET ROLE regress_view_relay;
SELECT * FROM pg_temp.read_views('{outbox_lag}');
RESET ROLE;

-- What the monitoring role read is what the owner reads.
SET ROLE regress_view_monitor;
CREATE TEMP TABLE monitor_saw AS
SELECT scope, received, processing, completed, failed_retryable, failed_final
  FROM idempotency.idem_stats WHERE scope = 'view';
SELECT key, status FROM idempotency.idem_stuck WHERE scope = 'view' ORDER BY key;
RESET ROLE;
SELECT (SELECT row(m.*)::text FROM monitor_saw m) =
       (SELECT row(s.*)::text FROM (SELECT scope, received, processing, completed, failed_retryable, failed_final
                                      FROM idempotency.idem_stats WHERE scope = 'view') s) AS same_stats;
SELECT * FROM monitor_saw;

DROP TABLE monitor_saw;
SELECT idempotency.revoke_role(r::regrole) FROM unnest(ARRAY['regress_view_monitor', 'regress_view_admin',
    'regress_view_relay']) r;
DROP ROLE regress_view_monitor, regress_view_pgmon, regress_view_admin, regress_view_relay;
DELETE FROM idempotency.outbox WHERE topic = 'view.topic';
DELETE FROM idempotency.idempotency_keys WHERE scope = 'view';
