-- inbox_receive: the consumer-side inbox.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message' (tokens masked).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N', 'g');
END $f$;
-- Tokens this session has seen, by label. show(label, outcome) prints an
-- outcome with its token as 'new' (greater than every token seen so far; it
-- is then remembered under label) or '=label', and retry_after as its sign.
CREATE TEMP TABLE seen (label text PRIMARY KEY, token bigint NOT NULL);
CREATE FUNCTION pg_temp.tok(l text) RETURNS bigint LANGUAGE sql AS $f$
    SELECT token FROM seen WHERE label = l $f$;
CREATE FUNCTION pg_temp.show(l text, r idempotency.idem_outcome)
RETURNS TABLE (outcome text, status idempotency.idem_status, token text, attempt int,
               result jsonb, error text, retry_after text, job_ref text)
LANGUAGE plpgsql AS $f$
DECLARE
    known text;
BEGIN
    SELECT string_agg(s.label, ',' ORDER BY s.label) INTO known FROM seen s WHERE s.token = r.token;
    outcome := r.outcome; status := r.status; attempt := r.attempt;
    result := r.result; error := r.error; job_ref := r.job_ref;
    token := CASE WHEN r.token IS NULL THEN NULL
                  WHEN known IS NOT NULL THEN '=' || known
                  WHEN r.token > (SELECT coalesce(max(s.token), 0) FROM seen s) THEN 'new'
                  ELSE 'old, unseen' END;
    IF r.token IS NOT NULL AND known IS NULL AND l IS NOT NULL THEN
        INSERT INTO seen VALUES (l, r.token);
    END IF;
    retry_after := CASE WHEN r.retry_after IS NULL THEN NULL
                        WHEN r.retry_after = '0' THEN '0'
                        WHEN r.retry_after > '0' THEN 'positive'
                        ELSE 'negative' END;
    RETURN NEXT;
END $f$;

-- true the first time (source, message_id) is seen, false for a duplicate.
SELECT idempotency.inbox_receive('msg-1', 'orders', '{"order": 1}') AS first_time;
SELECT idempotency.inbox_receive('msg-1', 'orders', '{"order": 1}') AS first_time;
-- The payload does not take part: the same id with another payload is a duplicate.
SELECT idempotency.inbox_receive('msg-1', 'orders', '{"order": 2}') AS first_time;
SELECT idempotency.inbox_receive('msg-1', 'orders') AS first_time;
-- The source is part of the identity; it defaults to 'default'.
SELECT idempotency.inbox_receive('msg-1', 'billing') AS first_time;
SELECT idempotency.inbox_receive('msg-1') AS first_time;
SELECT idempotency.inbox_receive('msg-1', 'default') AS first_time;
SELECT idempotency.inbox_receive('msg-1', source => 'default', payload => '[1]') AS first_time;
-- Case and spaces matter: ids are compared exactly.
SELECT idempotency.inbox_receive('MSG-1', 'orders') AS first_time;
SELECT idempotency.inbox_receive('msg-1 ', 'orders') AS first_time;
-- What was stored: the first payload, with the time of receipt.
SELECT source, quote_literal(message_id) AS message_id, payload, received_at <= clock_timestamp() AS received
  FROM idempotency.inbox WHERE message_id ILIKE 'msg-1%' ORDER BY source COLLATE "C", message_id COLLATE "C";

-- Inside the consumer's transaction: a duplicate the same transaction
-- already received is false; a rolled back receipt never happened.
BEGIN;
SELECT idempotency.inbox_receive('msg-2', 'orders') AS first_time;
SELECT idempotency.inbox_receive('msg-2', 'orders') AS first_time;
ROLLBACK;
SELECT idempotency.inbox_receive('msg-2', 'orders') AS first_time;
-- The consumer's business write and the receipt commit together.
CREATE TEMP TABLE applied (message_id text);
BEGIN;
SELECT idempotency.inbox_receive('msg-3', 'orders') AS first_time;
INSERT INTO applied VALUES ('msg-3');
COMMIT;
BEGIN;
SELECT idempotency.inbox_receive('msg-3', 'orders') AS first_time;
-- (a consumer applies the message only when first_time is true)
COMMIT;
SELECT count(*) AS applied FROM applied;
-- A savepoint rolled back takes its receipt with it.
BEGIN;
SAVEPOINT s;
SELECT idempotency.inbox_receive('msg-4', 'orders') AS first_time;
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.inbox_receive('msg-4', 'orders') AS first_time;
COMMIT;
SELECT idempotency.inbox_receive('msg-4', 'orders') AS first_time;
-- In one statement, only the first of two equal ids is new.
SELECT m, idempotency.inbox_receive(m, 'batch') AS first_time
  FROM (VALUES (1, 'b-1'), (2, 'b-2'), (3, 'b-1')) v(n, m) ORDER BY n;
-- Limits (every argument is checked in validation.sql).
SELECT pg_temp.try($$SELECT idempotency.inbox_receive(NULL, 'orders')$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('msg-5', NULL)$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('', 'orders')$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('msg-5', '')$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive(repeat('m', 255), 'orders')$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive(repeat('m', 256), 'orders')$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('msg-5', repeat('s', 255))$$);
SELECT pg_temp.try($$SELECT idempotency.inbox_receive('msg-5', repeat('s', 256))$$);
