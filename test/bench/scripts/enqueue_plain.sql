-- enqueue, plain SQL: the same row INSERTed into bench.outbox, which has the
-- same columns and indexes as idempotency.outbox (what a relay needs).
\set k random(1, 1000)
INSERT INTO bench.outbox (topic, key, payload, enqueued_at, available_at, updated_at, ready_at)
VALUES ('orders', :k, '{"order": 42, "amount": 1999, "currency": "EUR"}',
        clock_timestamp(), clock_timestamp(), clock_timestamp(), clock_timestamp())
RETURNING id \gset
