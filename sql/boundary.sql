-- The C++ / PostgreSQL boundary: C++ exceptions of every kind become clean
-- SQL errors with the right SQLSTATE, and PostgreSQL errors raised under C++
-- frames unwind normally; the backend survives all of them.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $f$;
SELECT pg_backend_pid() AS pid, pg_postmaster_start_time() AS started \gset

-- As the client sees them.
SELECT idempotency.boundary_selftest('error');
SELECT idempotency.boundary_selftest('runtime');
SELECT idempotency.boundary_selftest('bad_alloc');
SELECT idempotency.boundary_selftest('other');
SELECT idempotency.boundary_selftest('postgres');
-- With their SQLSTATEs: idem::Error keeps its own (IK003), std::bad_alloc is
-- out of memory (53200), any other exception an internal error (XX000).
SELECT kind, pg_temp.try(format('SELECT idempotency.boundary_selftest(%L)', kind)) AS result
  FROM (VALUES (1, 'error'), (2, 'runtime'), (3, 'bad_alloc'), (4, 'other'), (5, 'postgres'),
               (6, 'nothing'), (7, NULL)) v(n, kind) ORDER BY n;
-- Caught inside PL/pgSQL like any SQL error.
DO $$
BEGIN
    PERFORM idempotency.boundary_selftest('error');
EXCEPTION WHEN SQLSTATE 'IK003' THEN
    RAISE NOTICE 'caught IK003: %', SQLERRM;
END $$;
DO $$
BEGIN
    PERFORM idempotency.boundary_selftest('postgres');
EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'caught division_by_zero: %', SQLERRM;
END $$;
-- Many times over, inside one transaction with savepoints.
BEGIN;
SELECT count(*) AS calls, count(DISTINCT r) AS distinct_results
  FROM generate_series(1, 2000) g,
       pg_temp.try(format('SELECT idempotency.boundary_selftest(%L)',
                          (ARRAY['error', 'runtime', 'bad_alloc', 'other', 'postgres'])[g % 5 + 1])) r;
COMMIT;

-- Real functions raise PostgreSQL errors from under their C++ frames too:
-- a statement timeout cancels a claim (and a lock) that is waiting.
SELECT outcome FROM idempotency.idem_claim('boundary-held', lease => '1 min');
SELECT idempotency.idem_lock('boundary-res', '1 min') IS NOT NULL AS locked;
SET statement_timeout = '200ms';
SELECT idempotency.idem_claim('boundary-held', wait => '10s');
SELECT idempotency.idem_lock('boundary-res', wait => '10s');
\set VERBOSITY sqlstate
SELECT idempotency.idem_claim('boundary-held', wait => '10s');
SELECT idempotency.idem_lock('boundary-res', wait => '10s');
\set VERBOSITY default
RESET statement_timeout;
SELECT status, attempts FROM idempotency.idem_get('boundary-held');
-- An error of a C++ function inside a transaction rolls the transaction
-- back cleanly, and the session goes on.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('boundary-tx');
SAVEPOINT s;
SELECT idempotency.boundary_selftest('runtime');
ROLLBACK TO SAVEPOINT s;
SELECT outcome FROM idempotency.idem_claim('boundary-tx');
SELECT idempotency.boundary_selftest('bad_alloc');
COMMIT;
SELECT idempotency.idem_get('boundary-tx') IS NULL AS rolled_back;

-- A C++ exception in a transaction callback is caught like one in a
-- function: thrown before the commit, it aborts the transaction with a
-- clean error (here with the key its transaction claimed), and the session
-- goes on.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('boundary-callback');
SELECT idempotency.boundary_selftest('commit');
COMMIT;
SELECT idempotency.idem_get('boundary-callback') IS NULL AS rolled_back;
SELECT outcome FROM idempotency.idem_claim('boundary-callback');

-- An error raised under one of the extension's statements (here by a
-- trigger the owner added) shows its own message and context, never the
-- extension's internal SQL.
CREATE FUNCTION public.boundary_refuse() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'refused by a trigger on %', TG_TABLE_NAME;
END $f$;
SELECT token AS t FROM idempotency.idem_claim('boundary-trigger') \gset
CREATE TRIGGER refuse BEFORE UPDATE ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.boundary_refuse();
SELECT idempotency.idem_complete('boundary-trigger', :t);
CREATE TRIGGER refuse_insert BEFORE INSERT ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.boundary_refuse();
SELECT idempotency.idem_claim('boundary-trigger-2');
DROP TRIGGER refuse ON idempotency.idempotency_keys;
DROP TRIGGER refuse_insert ON idempotency.idempotency_keys;
DROP FUNCTION public.boundary_refuse();
-- The functions work as their owner, as a SECURITY DEFINER function does:
-- code running inside (a trigger) may not change the role.
CREATE FUNCTION public.boundary_escape() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    SET ROLE NONE;
    RETURN NEW;
END $f$;
CREATE TRIGGER escape BEFORE INSERT ON idempotency.idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION public.boundary_escape();
SELECT idempotency.idem_claim('boundary-escape');
DROP TRIGGER escape ON idempotency.idempotency_keys;
DROP FUNCTION public.boundary_escape();
SELECT idempotency.idem_get('boundary-escape') IS NULL AS nothing_claimed;
SELECT outcome FROM idempotency.idem_complete('boundary-trigger', :t);

-- Same backend, same postmaster: nothing crashed.
SELECT pg_backend_pid() = :pid AS same_backend, pg_postmaster_start_time() = :'started' AS no_restart;
