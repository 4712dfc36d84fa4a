-- enqueue, plain SQL into a table with only a primary key (bench.outbox_pk):
-- the floor of an INSERT, not an outbox a relay could work from.
\set k random(1, 1000)
INSERT INTO bench.outbox_pk (topic, key, payload, enqueued_at, available_at, updated_at)
VALUES ('orders', :k, '{"order": 42, "amount": 1999, "currency": "EUR"}',
        clock_timestamp(), clock_timestamp(), clock_timestamp())
RETURNING id \gset
