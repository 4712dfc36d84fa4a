-- A claim answered in_progress reports in retry_after when the holder is
-- expected to be done, from how long the scope's recent completions took
-- (claim to complete, smoothed), never more than its lease left; a scope
-- without completions reports the lease left. So a client retries a 300 ms
-- job after about a second, not after its 30 s lease.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE FUNCTION pg_temp.work_for(scope text, key text, seconds float8) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE t bigint;
BEGIN
    SELECT token INTO t FROM idempotency.idem_claim(key, scope => scope);
    PERFORM pg_sleep(seconds);
    PERFORM idempotency.idem_complete(key, t, scope => scope);
END $f$;
SELECT count(*) AS jobs FROM (SELECT pg_temp.work_for('estimate', 'job-' || g, 0.3)
                                FROM generate_series(1, 8) g) done;
SELECT outcome FROM idempotency.idem_claim('running', lease => '30 s', scope => 'estimate');
-- The jobs took 0.3 s each, more on a busy machine. Whatever they took and
-- however long ago the holder claimed, the rule's answer lies between a
-- quarter of the shortest (overdue: look again soon) and three times the
-- longest (the mean plus twice the mean deviation): far below the lease.
CREATE TEMP VIEW job_durations AS
SELECT min(completed_at - claimed_at) / 4 AS low, max(completed_at - claimed_at) * 3 AS high
  FROM idempotency.idempotency_keys WHERE scope = 'estimate' AND status = 'COMPLETED';
SELECT high < interval '5 s' AS jobs_were_short FROM job_durations;
SELECT outcome, retry_after BETWEEN low AND high AS about_the_job, status
  FROM idempotency.idem_claim('running', scope => 'estimate'), job_durations;
SELECT outcome, retry_after BETWEEN low AND high AS about_the_job
  FROM idempotency.idem_register('running', scope => 'estimate'), job_durations;
-- Never past the lease left: work of this scope takes about 3 s, the lease
-- is 2 s.
SELECT pg_temp.work_for('estimate-slow', 'slow-job', 1.5);
SELECT outcome FROM idempotency.idem_claim('short-lease', lease => '2 s', scope => 'estimate-slow');
SELECT outcome, retry_after <= interval '2 s' AS within_the_lease
  FROM idempotency.idem_claim('short-lease', scope => 'estimate-slow');
-- No completion in the scope: the lease left.
SELECT outcome FROM idempotency.idem_claim('running', lease => '30 s', scope => 'estimate-none');
SELECT outcome, retry_after > interval '29 s' AS the_lease_left
  FROM idempotency.idem_claim('running', scope => 'estimate-none');
-- A retry that is not due yet still reports its backoff.
SELECT idempotency.idem_fail('failing', (idempotency.idem_claim('failing', scope => 'estimate')).token,
                                          'boom', true, '1 hour', 'estimate');
SELECT outcome, retry_after > interval '59 min' AS the_backoff_left
  FROM idempotency.idem_claim('failing', scope => 'estimate');
DROP VIEW job_durations;
DELETE FROM idempotency.idempotency_keys WHERE scope IN ('estimate', 'estimate-none', 'estimate-slow');
