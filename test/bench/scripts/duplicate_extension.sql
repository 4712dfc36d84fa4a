-- duplicate, extension: claim of one of the 10000 preloaded COMPLETED keys.
\set k random(1, 10000)
SELECT outcome, result FROM idempotency.idem_claim(:k, NULL, interval '30 seconds')
 WHERE outcome = 'completed' \gset
