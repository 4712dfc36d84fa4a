-- enqueue, physical floor: the same event INSERTed into bench.floor_outbox
-- (its primary key and one partial index on the ids not yet published).
\set k random(1, 1000)
INSERT INTO bench.floor_outbox (topic, key, payload)
VALUES ('orders', :k, '{"order": 42, "amount": 1999, "currency": "EUR"}')
RETURNING id \gset
