-- one_txn, extension: BEGIN; claim a new key; complete it; COMMIT.
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
BEGIN;
SELECT outcome, token FROM idempotency.idem_claim(:k, NULL, interval '30 seconds') \gset
SELECT outcome, attempt FROM idempotency.idem_complete(:k, :token, '{"status": 200, "order": 42, "ok": true}') \gset
COMMIT;
