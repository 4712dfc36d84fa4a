-- Checks after the run. One row per figure: name|value|verdict, where verdict
-- is ok or FAIL for an invariant, info for a figure that is only reported.
\set ON_ERROR_STOP 1
WITH
keys AS (SELECT * FROM idempotency.idempotency_keys WHERE scope = 'stress'),
per_key AS (SELECT scope, key, count(*) AS n FROM effects GROUP BY scope, key),
grants AS (
    SELECT key, token, attempt,
           lag(token) OVER w AS prev_token, lag(attempt) OVER w AS prev_attempt
      FROM claim_log WHERE outcome = 'claimed'
    WINDOW w AS (PARTITION BY key ORDER BY token)),
-- A grant after an earlier one that its holder did not fail itself: the
-- earlier lease ran out and this claim took the key over.
takeovers AS (
    SELECT g.* FROM grants g
     WHERE g.prev_token IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM fail_log f WHERE f.key = g.key AND f.token = g.prev_token)),
late_ok AS (
    SELECT c.* FROM complete_log c JOIN claim_log g ON g.key = c.key AND g.token = c.token
     WHERE g.outcome = 'claimed' AND c.at > g.at + make_interval(secs => g.lease_ms / 1000.0)),
figures(ord, name, value, verdict) AS (
    SELECT 1, 'keys with more than one effect', (SELECT count(*) FROM per_key WHERE n > 1), 'zero'
    UNION ALL
    SELECT 2, 'COMPLETED keys without exactly one effect, of its token',
           (SELECT count(*) FROM keys k
             WHERE k.status = 'COMPLETED'
               AND ((SELECT count(*) FROM effects e WHERE e.scope = k.scope AND e.key = k.key) <> 1
                    OR NOT EXISTS (SELECT 1 FROM effects e
                                    WHERE e.scope = k.scope AND e.key = k.key AND e.token = k.token)
                    OR (k.result->>'token')::bigint IS DISTINCT FROM k.token)), 'zero'
    UNION ALL
    SELECT 3, 'effects of keys that are not COMPLETED',
           (SELECT count(*) FROM effects e LEFT JOIN keys k ON k.scope = e.scope AND k.key = e.key
             WHERE k.status IS DISTINCT FROM 'COMPLETED'), 'zero'
    UNION ALL
    SELECT 4, 'lease generations granted twice (same key, same attempt)',
           (SELECT count(*) FROM (SELECT 1 FROM grants GROUP BY key, attempt HAVING count(*) > 1) d), 'zero'
    UNION ALL
    SELECT 5, 'grants whose token or attempt did not grow',
           (SELECT count(*) FROM grants WHERE prev_token IS NOT NULL AND attempt <= prev_attempt), 'zero'
    UNION ALL
    SELECT 6, 'completing tokens never granted',
           (SELECT count(*) FROM keys k WHERE k.status = 'COMPLETED'
               AND NOT EXISTS (SELECT 1 FROM claim_log g
                                WHERE g.key = k.key AND g.token = k.token AND g.outcome = 'claimed')), 'zero'
    UNION ALL
    SELECT 7, 'accepted completions - COMPLETED keys',
           (SELECT count(*) FROM complete_log) - (SELECT count(*) FROM keys WHERE status = 'COMPLETED'), 'zero'
    UNION ALL
    SELECT 8, 'takeovers (expired lease claimed by another)', (SELECT count(*) FROM takeovers), 'positive'
    UNION ALL
    SELECT 9, 'fenced late workers (IK001 caught)', (SELECT count(*) FROM fence_log), 'positive'
    UNION ALL
    SELECT 10, '  of which complete', (SELECT count(*) FROM fence_log WHERE call = 'complete'), 'info'
    UNION ALL
    SELECT 11, '  of which fail', (SELECT count(*) FROM fence_log WHERE call = 'fail'), 'info'
    UNION ALL
    SELECT 12, 'keys with attempts > 1', (SELECT count(*) FROM keys WHERE attempts > 1), 'info'
    UNION ALL
    SELECT 13, 'keys', (SELECT count(*) FROM keys), 'info'
    UNION ALL
    SELECT 14, 'claims answered', (SELECT count(*) FROM claim_log), 'info'
    UNION ALL
    SELECT 15, 'claims granted', (SELECT count(*) FROM grants), 'info'
    UNION ALL
    SELECT 16, 'completions (COMPLETED keys)', (SELECT count(*) FROM complete_log), 'info'
    UNION ALL
    SELECT 17, 'late completions accepted (lease over, not taken over)', (SELECT count(*) FROM late_ok), 'info'
    UNION ALL
    SELECT 18, 'retryable failures accepted', (SELECT count(*) FROM fail_log), 'info'
    UNION ALL
    SELECT 19, 'replays (claim answered completed)',
           (SELECT count(*) FROM claim_log WHERE outcome = 'completed') + (SELECT count(*) FROM replay_log), 'info'
    UNION ALL
    SELECT 20, '  of which checked right after completing', (SELECT count(*) FROM replay_log), 'info'
    UNION ALL
    SELECT 21, 'answers in_progress', (SELECT count(*) FROM claim_log WHERE outcome = 'in_progress'), 'info'
    UNION ALL
    SELECT 22, 'answers retry_later', (SELECT count(*) FROM claim_log WHERE outcome = 'retry_later'), 'info'
    UNION ALL
    SELECT 23, 'answers failed (FAILED_FINAL)', (SELECT count(*) FROM claim_log WHERE outcome = 'failed'), 'info'
)
SELECT name, value, verdict FROM (
    SELECT ord, name, coalesce(value::text, '') AS value,
           CASE verdict
               WHEN 'zero' THEN CASE WHEN value = 0 THEN 'ok' ELSE 'FAIL' END
               WHEN 'positive' THEN CASE WHEN value > 0 THEN 'ok' ELSE 'FAIL' END
               ELSE verdict END AS verdict
      FROM figures
    UNION ALL
    SELECT 99, 'keys by final status',
           coalesce((SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
                       FROM (SELECT status::text, count(*) AS n FROM idempotency.idempotency_keys
                              WHERE scope = 'stress' GROUP BY status) s), ''),
           'info') t
 ORDER BY ord;
