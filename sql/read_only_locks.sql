-- A call that locks a key's row in a READ ONLY transaction raises 25006, as
-- the statement it stands for (SELECT ... FOR NO KEY UPDATE) does: the row
-- lock would write the row. idem_assert_owner and idem_release lock the row
-- before they decide; found by the differential test (test/differential/).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- try(sql): 'ok', or the SQLSTATE it failed with.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $f$;
SELECT outcome, status FROM idempotency.idem_claim('ro-1', scope => 'read_only_locks');
CREATE TEMP TABLE held AS
    SELECT token FROM idempotency.idempotency_keys WHERE scope = 'read_only_locks' AND key = 'ro-1';
BEGIN READ ONLY;
SELECT pg_temp.try(format('SELECT idempotency.idem_assert_owner(%L, %s, %L)',
                          'ro-1', (SELECT token FROM held), 'read_only_locks')) AS assert_owner;
SELECT pg_temp.try(format('SELECT idempotency.idem_release(%L, %s, %L)',
                          'ro-1', (SELECT token FROM held), 'read_only_locks')) AS release;
-- A stale token: the lock is refused before the token is looked at.
SELECT pg_temp.try(format('SELECT idempotency.idem_release(%L, %s, %L)',
                          'ro-1', (SELECT token - 1 FROM held), 'read_only_locks')) AS release_stale;
COMMIT;
-- Nothing changed, and the row is not locked: a read-write transaction
-- asserts and releases it.
SELECT status, token = (SELECT token FROM held) AS same_token
  FROM idempotency.idempotency_keys WHERE scope = 'read_only_locks' AND key = 'ro-1';
SELECT pg_temp.try(format('SELECT idempotency.idem_assert_owner(%L, %s, %L)',
                          'ro-1', (SELECT token FROM held), 'read_only_locks')) AS assert_owner;
SELECT pg_temp.try(format('SELECT idempotency.idem_release(%L, %s, %L)',
                          'ro-1', (SELECT token FROM held), 'read_only_locks')) AS release;
SELECT status FROM idempotency.idempotency_keys WHERE scope = 'read_only_locks' AND key = 'ro-1';
