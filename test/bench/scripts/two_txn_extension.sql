-- two_txn, extension: claim a new key (commits), then complete it (commits).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
SELECT outcome, token FROM idempotency.idem_claim(:k, NULL, interval '30 seconds') \gset
SELECT outcome, attempt FROM idempotency.idem_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}') \gset
