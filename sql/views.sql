-- Views idem_stats and idem_stuck (readability by roles is in privileges.sql).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message' (tokens masked).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g');
END $f$;
-- Tokens this session has seen, by label. show(label, outcome) prints an
-- outcome with its token as 'new' (greater than every token seen so far; it
-- is then remembered under label) or '=label', and retry_after as its sign.
CREATE TEMP TABLE seen (label text PRIMARY KEY, token bigint NOT NULL);
CREATE FUNCTION pg_temp.tok(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT token FROM seen WHERE label = l $f$;
CREATE FUNCTION pg_temp.show(l text, r idempotency.idem_outcome)
RETURNS TABLE (outcome text, status idempotency.idem_status, token text, attempt int,
               result jsonb, error text, retry_after text, job_ref text)
LANGUAGE plpgsql AS $f$
DECLARE
    known text;
BEGIN
    SELECT string_agg(s.label, ',' ORDER BY s.label) INTO known FROM seen s WHERE s.token = r.token;
    outcome := r.outcome; status := r.status; attempt := r.attempt;
    result := r.result; error := r.error; job_ref := r.job_ref;
    token := CASE WHEN r.token IS NULL THEN NULL
                  WHEN known IS NOT NULL THEN '=' || known
                  WHEN r.token > (SELECT coalesce(max(s.token), 0) FROM seen s) THEN 'new'
                  ELSE 'old, unseen' END;
    IF r.token IS NOT NULL AND known IS NULL AND l IS NOT NULL THEN
        INSERT INTO seen VALUES (l, r.token);
    END IF;
    retry_after := CASE WHEN r.retry_after IS NULL THEN NULL
                        WHEN r.retry_after = '0' THEN '0'
                        WHEN r.retry_after > '0' THEN 'positive'
                        ELSE 'negative' END;
    RETURN NEXT;
END $f$;

-- Their columns.
SELECT c.relname, string_agg(a.attname, ', ' ORDER BY a.attnum) AS columns
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'v'
 GROUP BY c.relname ORDER BY c.relname;

-- One key in every state in scope views.a, one PROCESSING key in views.b.
SELECT outcome FROM idempotency.idem_register('v-received', scope => 'views.a');
SELECT * FROM pg_temp.show('p1', idempotency.idem_claim('v-processing', lease => '1 min', scope => 'views.a'));
SELECT * FROM pg_temp.show('p2', idempotency.idem_claim('v-expired', lease => '0.5s', scope => 'views.a'));
SELECT * FROM pg_temp.show('c1', idempotency.idem_claim('v-completed', scope => 'views.a'));
SELECT outcome FROM idempotency.idem_complete('v-completed', pg_temp.tok('c1'), scope => 'views.a');
SELECT * FROM pg_temp.show('f1', idempotency.idem_claim('v-retryable', scope => 'views.a'));
SELECT idempotency.idem_fail('v-retryable', pg_temp.tok('f1'), 'later', retry_in => '1 hour', scope => 'views.a');
SELECT * FROM pg_temp.show('f2', idempotency.idem_claim('v-final', scope => 'views.a'));
SELECT idempotency.idem_fail('v-final', pg_temp.tok('f2'), 'never', false, scope => 'views.a');
SELECT * FROM pg_temp.show('p3', idempotency.idem_claim('v-other', lease => '1 min', scope => 'views.b'));

-- Counts per scope; nothing is stuck yet.
SELECT scope, received, processing, completed, failed_retryable, failed_final, stuck,
       oldest_processing_age >= '0' AND oldest_processing_age < '10s' AS oldest_processing_age_ok
  FROM idempotency.idem_stats WHERE scope LIKE 'views.%' ORDER BY scope;
SELECT count(*) AS stuck FROM idempotency.idem_stuck WHERE scope LIKE 'views.%';
-- Kept as the transactions commit (docs/monitoring.md: counted_by).
SELECT DISTINCT counted_by FROM idempotency.idem_stats WHERE scope LIKE 'views.%';
SELECT pg_sleep(0.6);
-- A PROCESSING key whose lease has expired is stuck.
SELECT scope, processing, stuck, oldest_processing_age >= '0.3s' AS oldest_processing_age_ok
  FROM idempotency.idem_stats WHERE scope LIKE 'views.%' ORDER BY scope;
SELECT scope, key, status, attempts, token = pg_temp.tok('p2') AS token_is_p2,
       lease_until < clock_timestamp() AS lease_over, stuck_for >= '0.3s' AS stuck_for_ok,
       holder_pid = pg_backend_pid() AS my_backend
  FROM idempotency.idem_stuck WHERE scope LIKE 'views.%' ORDER BY scope, key;
-- stuck_after: PROCESSING longer than that (even with a live lease), and
-- RECEIVED older than that, count as stuck too.
SHOW idempotency.stuck_after;
SELECT idempotency.stuck_after();
SET idempotency.stuck_after = '0.5s';
SELECT idempotency.stuck_after();
SELECT scope, received, processing, stuck FROM idempotency.idem_stats WHERE scope LIKE 'views.%' ORDER BY scope;
SELECT scope, key, status, lease_until < clock_timestamp() AS lease_over, stuck_for >= '0.3s' AS stuck_for_ok
  FROM idempotency.idem_stuck WHERE scope LIKE 'views.%' ORDER BY scope, key;
-- A heartbeat keeps the lease alive but not the key from being stuck:
-- stuck_for counts from the last change of state.
SELECT idempotency.idem_heartbeat('v-processing', pg_temp.tok('p1'), '1 min', 'views.a') > clock_timestamp() AS renewed;
SELECT key, stuck_for >= '0.3s' AS stuck_for_ok FROM idempotency.idem_stuck
 WHERE scope = 'views.a' AND key = 'v-processing';
-- A new claim is a change of state: the taken-over key is no longer stuck.
SELECT * FROM pg_temp.show('p4', idempotency.idem_claim('v-expired', lease => '1 min', scope => 'views.a'));
SELECT key FROM idempotency.idem_stuck WHERE scope = 'views.a' ORDER BY key;
SELECT scope, processing, stuck FROM idempotency.idem_stats WHERE scope = 'views.a';
RESET idempotency.stuck_after;
SELECT scope, stuck FROM idempotency.idem_stats WHERE scope LIKE 'views.%' ORDER BY scope;
-- Finished keys are never stuck.
SELECT outcome FROM idempotency.idem_complete('v-processing', pg_temp.tok('p1'), scope => 'views.a');
SELECT outcome FROM idempotency.idem_complete('v-expired', pg_temp.tok('p4'), scope => 'views.a');
SELECT idempotency.idem_release('v-other', pg_temp.tok('p3'), 'views.b');
SET idempotency.stuck_after = '1ms';
SELECT scope, received, processing, completed, failed_retryable, failed_final, stuck,
       oldest_processing_age
  FROM idempotency.idem_stats WHERE scope LIKE 'views.%' ORDER BY scope;
SELECT key, status FROM idempotency.idem_stuck WHERE scope LIKE 'views.%' ORDER BY key;
RESET idempotency.stuck_after;

-- The finished keys are counted as the transactions that finish them
-- commit: a savepoint rolled back takes its change back.
SELECT * FROM pg_temp.show('s1', idempotency.idem_claim('v-savepoint', scope => 'views.a'));
BEGIN;
SAVEPOINT before_complete;
SELECT outcome FROM idempotency.idem_complete('v-savepoint', pg_temp.tok('s1'), scope => 'views.a');
ROLLBACK TO before_complete;
SELECT idempotency.idem_fail('v-savepoint', pg_temp.tok('s1'), 'not now', scope => 'views.a');
COMMIT;
SELECT scope, processing, completed, failed_retryable FROM idempotency.idem_stats WHERE scope = 'views.a';
-- Every count agrees with the table's rows.
SELECT s.scope, s.received = c.received AND s.processing = c.processing
                AND s.completed = c.completed AND s.failed_retryable = c.failed_retryable
                AND s.failed_final = c.failed_final AS counts_agree
  FROM idempotency.idem_stats s
  JOIN (SELECT k.scope, count(*) FILTER (WHERE k.status = 'RECEIVED') AS received,
               count(*) FILTER (WHERE k.status = 'PROCESSING') AS processing,
               count(*) FILTER (WHERE k.status = 'COMPLETED') AS completed,
               count(*) FILTER (WHERE k.status = 'FAILED_RETRYABLE') AS failed_retryable,
               count(*) FILTER (WHERE k.status = 'FAILED_FINAL') AS failed_final
          FROM idempotency.idempotency_keys k GROUP BY k.scope) c ON c.scope = s.scope
 WHERE s.scope LIKE 'views.%' ORDER BY s.scope;
-- Rows deleted other than through the functions are still counted, until
-- idempotency.request_sweep() has the counts recounted from the table.
DELETE FROM idempotency.idempotency_keys WHERE scope = 'views.a' AND status = 'COMPLETED';
SELECT scope, completed FROM idempotency.idem_stats WHERE scope = 'views.a';
SELECT idempotency.request_sweep();
SELECT scope, completed, failed_retryable, failed_final FROM idempotency.idem_stats WHERE scope = 'views.a';
-- The views read only the live keys and the counts: the finished keys'
-- totals come with a row without a scope.
SELECT scope IS NULL AS all_scopes, completed >= 0 AS counted, counted_by
  FROM idempotency.key_counts() WHERE scope IS NULL;
