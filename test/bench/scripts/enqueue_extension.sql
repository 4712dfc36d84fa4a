-- enqueue, extension: one event (topic 'orders', one of ~1000 keys, a small
-- jsonb payload) through outbox_enqueue, in its own transaction.
\set k random(1, 1000)
SELECT idempotency.outbox_enqueue('orders', '{"order": 42, "amount": 1999, "currency": "EUR"}', :k) AS id \gset
