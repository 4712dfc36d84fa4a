-- one_txn, PL/pgSQL: BEGIN; claim a new key; complete it; COMMIT.
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
BEGIN;
SELECT outcome, token FROM bench.plpgsql_claim(:k, interval '30 seconds') \gset
SELECT outcome, attempt FROM bench.plpgsql_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}') \gset
COMMIT;
