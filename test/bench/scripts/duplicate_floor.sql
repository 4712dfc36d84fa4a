-- duplicate, physical floor: a bare SELECT by primary key of one of the
-- 10000 preloaded keys in bench.idempotency_keys (the row shape of the
-- extension's table), its status and result.
\set k random(1, 10000)
SELECT status, result FROM bench.idempotency_keys WHERE scope = 'default' AND key = :k \gset
