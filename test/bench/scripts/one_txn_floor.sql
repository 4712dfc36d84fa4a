-- one_txn, physical floor: BEGIN; INSERT a new row; UPDATE it with the
-- result; COMMIT (bench.floor_keys: a text primary key and a jsonb column).
\set n :n + 1
\set k (:client_id + 1) * 1000000000 + :n
BEGIN;
INSERT INTO bench.floor_keys (key) VALUES (:k);
UPDATE bench.floor_keys SET result = '{"status": 200, "order": 42, "ok": true}' WHERE key = :k;
COMMIT;
