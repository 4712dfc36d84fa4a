-- two_txn, PL/pgSQL: claim a new key (commits), then complete it (commits).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
SELECT outcome, token FROM bench.plpgsql_claim(:k, interval '30 seconds') \gset
SELECT outcome, attempt FROM bench.plpgsql_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}') \gset
