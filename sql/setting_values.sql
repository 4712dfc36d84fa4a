-- A bad value of a setting never reaches the work: each is refused with
-- the same SQLSTATE and message in both editions, the C++ extension's when
-- it is set, the SQL edition's (placeholders, checked when read) by the
-- first call that reads it. Each case sets the value and makes such a call
-- in one subtransaction, and prints the first error. The server-wide
-- settings of maintenance (purge_batch and the retentions) are set in a
-- session only in the SQL edition (the C++ extension answers 55P02 there):
-- its expected output differs in those rows. A statement timeout stops a
-- call that would not end (a purge_batch of 0 once looped for ever).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE FUNCTION pg_temp.set_then_call(setting text, value text, call text) RETURNS text
LANGUAGE plpgsql AS $f$
BEGIN
    SET LOCAL statement_timeout = '20s';
    EXECUTE format('SET LOCAL %s = %L', setting, value);
    EXECUTE call;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    -- PostgreSQL 16 on names the unit after both bounds of a range, as in
    -- "(1 ms .. 2147483647 ms)": print the bounds alone, as 15 does.
    RETURN SQLSTATE || ': '
        || regexp_replace(SQLERRM, '\((-?[0-9]+) [a-zA-Z]+ \.\. (-?[0-9]+) [a-zA-Z]+\)$', '(\1 .. \2)');
END $f$;

-- A key held by this session, for the calls that need one.
SELECT outcome FROM idempotency.idem_claim('sv-held', lease => '1 hour');
CREATE FUNCTION pg_temp.held_token() RETURNS bigint LANGUAGE sql
AS $$ SELECT token FROM idempotency.idempotency_keys WHERE key = 'sv-held' $$;

WITH calls (call, statement) AS (VALUES
    ('claim', $$SELECT idempotency.idem_claim('sv-a')$$),
    ('claim a request', $$SELECT idempotency.idem_claim('sv-a', request => '{}')$$),
    ('claim a 2 kB request', $$SELECT idempotency.idem_claim('sv-a', request => jsonb_build_object('pad', repeat('x', 2000)))$$),
    ('fail', $$SELECT idempotency.idem_fail('sv-held', pg_temp.held_token(), 'boom')$$),
    ('step', $$SELECT idempotency.idem_step('sv-held', pg_temp.held_token(), 'one')$$),
    ('step a result', $$SELECT idempotency.idem_step('sv-held', pg_temp.held_token(), 'one', '{}')$$),
    ('idem_stuck', $$SELECT count(*) FROM idempotency.idem_stuck$$),
    ('outbox_claim', $$SELECT idempotency.outbox_claim('sv-relay')$$),
    ('outbox_enqueue', $$SELECT idempotency.outbox_enqueue('sv.topic', '{}')$$),
    ('maintenance', $$SELECT idempotency.idem_maintenance()$$))
SELECT n, setting, value, call,
       pg_temp.set_then_call('idempotency.' || setting, value, statement) AS result
  FROM (VALUES
    (1, 'default_lease', '0', 'claim'),
    (2, 'default_lease', '-1s', 'claim'),
    (3, 'default_lease', 'soon', 'claim'),
    (4, 'max_lease', '0', 'claim'),
    (5, 'retention', '-1', 'claim'),
    (6, 'retention', '10000000000', 'claim'),
    (7, 'retention', 'for ever', 'claim'),
    (8, 'max_attempts', '0', 'claim'),
    (9, 'max_attempts', '-3', 'claim'),
    (10, 'max_attempts', 'three', 'claim'),
    (11, 'max_attempts', '2147483648', 'claim'),
    (12, 'retry_base_delay', '-1ms', 'fail'),
    (13, 'retry_max_delay', '-1', 'fail'),
    (14, 'stuck_after', '0', 'idem_stuck'),
    (15, 'max_value_bytes', '0', 'claim a request'),
    (16, 'max_value_bytes', 'lots', 'claim a request'),
    (17, 'max_steps', '0', 'step'),
    (18, 'max_steps', '10001', 'step'),
    (19, 'max_step_bytes', '0', 'step a result'),
    (20, 'outbox_max_attempts', '0', 'outbox_claim'),
    (21, 'outbox_run_length', '10001', 'outbox_claim'),
    (22, 'outbox_run_length', 'many', 'outbox_claim'),
    (23, 'outbox_notify', 'maybe', 'outbox_enqueue'),
    -- server-wide in the C++ extension
    (24, 'purge_batch', '0', 'maintenance'),
    (25, 'purge_batch', '-1', 'maintenance'),
    (26, 'purge_batch', 'some', 'maintenance'),
    (27, 'key_retention', '-5 days', 'maintenance'),
    (28, 'outbox_retention', '-1', 'maintenance'),
    (29, 'inbox_retention', 'a week', 'maintenance'),
    -- read as PostgreSQL reads them: a memory unit (hex, a fraction of one)
    -- and a boolean with no spaces around it
    (30, 'max_value_bytes', '1KB', 'claim a request'),
    (31, 'max_value_bytes', '0x100', 'claim a 2 kB request'),
    (32, 'max_value_bytes', '1.5kB', 'claim a 2 kB request'),
    (33, 'max_value_bytes', '-1', 'claim a request'),
    (34, 'outbox_notify', ' on ', 'outbox_enqueue')
  ) AS c (n, setting, value, call) JOIN calls USING (call)
 ORDER BY n;

-- Values in range are taken, with or without their unit, and kept by the
-- key they apply to.
SELECT pg_temp.set_then_call('idempotency.retention', ' 2 h', $$SELECT idempotency.idem_claim('sv-b')$$);
SET idempotency.retention = '7200';
SET idempotency.max_attempts = ' 4 ';
SELECT outcome FROM idempotency.idem_claim('sv-c');
RESET idempotency.retention;
RESET idempotency.max_attempts;
SELECT key, retention, max_attempts FROM idempotency.idempotency_keys WHERE key IN ('sv-b', 'sv-c') ORDER BY key;

-- A value is read as PostgreSQL reads an integer setting, in both editions:
-- a fraction rounded half to even, a unit converted then rounded, a leading
-- 0 octal, 0x hexadecimal, an exponent. Only the SQL edition reads an
-- interval too ('5 sec'), which the C++ extension refuses. (Each value is
-- set for the rest of the statement's transaction.)
CREATE TEMP TABLE sv_read AS
SELECT v.n, v.setting, v.value,
       pg_temp.set_then_call('idempotency.' || v.setting, v.value,
                             format('SELECT idempotency.idem_claim(%L)', 'sv-r' || v.n)) AS result
  FROM (VALUES (1, 'retention', '1.5'), (2, 'retention', '2.5'), (3, 'retention', '0.5 s'),
               (4, 'retention', '1500 ms'), (5, 'retention', '1499 ms'), (6, 'retention', '010'),
               (7, 'retention', '0x10'), (8, 'retention', '1e3'), (9, 'retention', '.5h'),
               (10, 'retention', ' 5min '), (11, 'retention', '2 d'), (12, 'retention', '010.5'),
               (13, 'max_attempts', '2.5'), (14, 'max_attempts', '3.5'), (15, 'max_attempts', '010'),
               (16, 'max_attempts', '4 s'), (17, 'retention', '1e10'), (18, 'retention', '5 sec'))
       AS v (n, setting, value);
SELECT r.n, r.setting, r.value, r.result,
       CASE r.setting WHEN 'retention' THEN k.retention::text ELSE k.max_attempts::text END AS taken
  FROM sv_read r LEFT JOIN idempotency.idempotency_keys k ON k.key = 'sv-r' || r.n
 ORDER BY r.n;
DROP TABLE sv_read;
DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'sv-r%';

-- Nothing a refused call began was kept: no key, no event; the held key still held.
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'sv-a') AS keys,
       (SELECT count(*) FROM idempotency.outbox WHERE topic = 'sv.topic') AS events,
       (SELECT status || ' ' || attempts FROM idempotency.idempotency_keys WHERE key = 'sv-held') AS held;
DELETE FROM idempotency.idempotency_keys WHERE key IN ('sv-held', 'sv-b', 'sv-c');
