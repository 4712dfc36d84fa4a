-- outbox_enqueue in a transaction of each isolation level. The C++
-- extension takes any level. The SQL edition refuses an event with a key
-- outside READ COMMITTED (0A000): it decides the key's head from what the
-- statement sees, and a transaction snapshot may miss the key's latest
-- events (the event would then wait for ever, or the key get two heads).
-- An event without a key has no head to decide, and goes in at any level.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
\set VERBOSITY terse
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT idempotency.outbox_enqueue('levels', '{"n": 1}', 'k') > 0 AS enqueued;
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT idempotency.outbox_enqueue('levels', '{"n": 2}') > 0 AS enqueued;
SELECT idempotency.outbox_enqueue('levels', '{"n": 3}', 'k') > 0 AS enqueued;
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT idempotency.outbox_enqueue('levels', '{"n": 4}', 'k') > 0 AS enqueued;
ROLLBACK;
SELECT count(*) AS left_behind FROM idempotency.outbox WHERE topic = 'levels';
