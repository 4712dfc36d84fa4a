-- steps, PL/pgSQL: the same job on the hand-written keys and steps table
-- (test/bench/steps_baseline.sql).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
SELECT token FROM bench.plpgsql_claim(:k, interval '30 seconds') \gset
SELECT bench.plpgsql_step(:k, :token, 'reserve', '{"reserved": 1}');
SELECT bench.plpgsql_step(:k, :token, 'charge', '{"charge_id": "ch_981"}');
SELECT bench.plpgsql_step(:k, :token, 'email', '{"message_id": "m-9"}');
SELECT outcome FROM bench.plpgsql_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}');
