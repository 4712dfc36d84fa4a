-- duplicate, PL/pgSQL: claim of one of the 10000 preloaded COMPLETED keys.
\set k random(1, 10000)
SELECT outcome, result FROM bench.plpgsql_claim(:k, interval '30 seconds')
 WHERE outcome = 'completed' \gset
