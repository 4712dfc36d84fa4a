-- steps, extension: a job of three steps, each in its own transaction as a
-- worker records them (claim, reserve, charge, email, complete).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
SELECT token FROM idempotency.idem_claim(:k, NULL, interval '30 seconds') \gset
SELECT idempotency.idem_step(:k, :token, 'reserve', '{"reserved": 1}');
SELECT idempotency.idem_step(:k, :token, 'charge', '{"charge_id": "ch_981"}');
SELECT idempotency.idem_step(:k, :token, 'email', '{"message_id": "m-9"}');
SELECT outcome FROM idempotency.idem_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}');
