-- two_txn, physical floor: INSERT a new row (commits), then UPDATE it with
-- the result (commits).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
INSERT INTO bench.floor_keys (key) VALUES (:k);
UPDATE bench.floor_keys SET result = '{"status": 200, "order": 42, "ok": true}' WHERE key = :k;
