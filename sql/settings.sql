-- The idempotency.* settings: defaults, units, who may SET which.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    -- PostgreSQL 16 on names the unit after both bounds of a range, as in
    -- "(1 ms .. 2147483647 ms)": print the bounds alone, as 15 does.
    RETURN SQLSTATE || ': '
        || regexp_replace(SQLERRM, '\((-?[0-9]+) [a-zA-Z]+ \.\. (-?[0-9]+) [a-zA-Z]+\)$', '(\1 .. \2)');
END $f$;

-- Every setting with its default, unit and context (user: any session;
-- superuser: superusers only; sighup: server-wide, reloaded on SIGHUP;
-- postmaster: set at server start).
-- (The test clusters set worker_enabled = off: see test/regress.conf.)
SELECT name, setting, unit, context, vartype, boot_val, min_val, max_val
  FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name COLLATE "C";
-- As SHOW prints them.
SELECT name, current_setting(name) AS shown
  FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name COLLATE "C";
-- The prefix is reserved: no made-up idempotency.* names.
SELECT pg_temp.try($$SET idempotency.no_such_setting = 1$$);

-- ---------------------------------------------------------------- a plain role
CREATE ROLE regress_idem_settings;
SELECT idempotency.grant_application('regress_idem_settings');
SET ROLE regress_idem_settings;
SELECT setting, pg_temp.try(format('SET %s = %L', setting, value)) AS result FROM (VALUES
    (1, 'idempotency.default_lease', '10s'),
    (2, 'idempotency.retention', '1h'),
    (3, 'idempotency.max_attempts', '3'),
    (4, 'idempotency.retry_base_delay', '500ms'),
    (5, 'idempotency.retry_max_delay', '1min'),
    (6, 'idempotency.stuck_after', '10min'),
    (7, 'idempotency.outbox_max_attempts', '20'),
    (8, 'idempotency.max_lease', '1h'),
    (9, 'idempotency.max_value_bytes', '1kB'),
    (10, 'idempotency.log_transitions', 'on'),
    (11, 'idempotency.outbox_retention', '2h'),
    (12, 'idempotency.inbox_retention', '1d'),
    (13, 'idempotency.naptime', '5s'),
    (14, 'idempotency.launcher_naptime', '1min'),
    (15, 'idempotency.purge_batch', '100'),
    (16, 'idempotency.worker_enabled', 'off'),
    (17, 'idempotency.expire_on_disconnect', 'on'),
    (18, 'idempotency.max_notifiers', '2')
) v(n, setting, value) ORDER BY n;
-- The session settings took effect for this session.
SELECT name, current_setting(name) AS shown
  FROM pg_settings WHERE name LIKE 'idempotency.%' AND context = 'user' ORDER BY name COLLATE "C";
-- ... and shape its calls.
SELECT outcome, attempt FROM idempotency.idem_claim('set-1');
SELECT lease_until - updated_at AS lease FROM idempotency.idem_get('set-1');
SELECT idempotency.idem_fail('set-1', (idempotency.idem_get('set-1')).token, 'x', retry_in => '0');
SELECT outcome, attempt FROM idempotency.idem_claim('set-1');
SELECT idempotency.idem_fail('set-1', (idempotency.idem_get('set-1')).token, 'x', retry_in => '0');
SELECT outcome, attempt FROM idempotency.idem_claim('set-1');
-- max_attempts = 3: the third failure is final.
SELECT idempotency.idem_fail('set-1', (idempotency.idem_get('set-1')).token, 'x', retry_in => '0');
SELECT outcome, status, attempt FROM idempotency.idem_claim('set-1');
SELECT expires_at - updated_at AS retained_for FROM idempotency.idem_get('set-1');
RESET ROLE;
RESET ALL;
REVOKE USAGE ON SCHEMA idempotency FROM regress_idem_settings;
SELECT idempotency.revoke_role('regress_idem_settings');
DROP ROLE regress_idem_settings;

-- ---------------------------------------------------------------- a superuser
SELECT setting, pg_temp.try(format('SET %s = %L', setting, value)) AS result FROM (VALUES
    (1, 'idempotency.max_lease', '1h'),
    (2, 'idempotency.max_value_bytes', '1MB'),
    (3, 'idempotency.max_value_bytes', '64kB'),
    (4, 'idempotency.log_transitions', 'on'),
    (5, 'idempotency.naptime', '5s'),
    (6, 'idempotency.inbox_retention', '1d'),
    (7, 'idempotency.purge_batch', '100'),
    (8, 'idempotency.worker_enabled', 'off')
) v(n, setting, value) ORDER BY n;
SHOW idempotency.max_lease;
SHOW idempotency.max_value_bytes;
SHOW idempotency.log_transitions;
RESET ALL;

-- ---------------------------------------------------------------- bad values
SELECT setting, pg_temp.try(format('SET %s = %L', setting, value)) AS result FROM (VALUES
    (1, 'idempotency.default_lease', '0'),
    (2, 'idempotency.default_lease', '-1s'),
    (3, 'idempotency.default_lease', 'soon'),
    (4, 'idempotency.max_attempts', '0'),
    (5, 'idempotency.retention', '-1'),
    (6, 'idempotency.retry_base_delay', '-1ms'),
    (7, 'idempotency.stuck_after', '0'),
    (8, 'idempotency.max_lease', '0'),
    (9, 'idempotency.max_value_bytes', '0'),
    (10, 'idempotency.outbox_max_attempts', '0'),
    (11, 'idempotency.log_transitions', 'maybe')
) v(n, setting, value) ORDER BY n;
-- A server-wide setting is checked when written to the configuration.
ALTER SYSTEM SET idempotency.max_notifiers = -1;
ALTER SYSTEM SET idempotency.max_notifiers = 33;
ALTER SYSTEM SET idempotency.max_notifiers = 'many';
-- Values that are allowed at their lower bound.
SELECT setting, pg_temp.try(format('SET %s = %L', setting, value)) AS result FROM (VALUES
    (1, 'idempotency.retention', '0'),
    (2, 'idempotency.retry_base_delay', '0'),
    (3, 'idempotency.retry_max_delay', '0'),
    (4, 'idempotency.max_attempts', '1'),
    (5, 'idempotency.default_lease', '1ms')
) v(n, setting, value) ORDER BY n;
RESET ALL;
