-- Validation of every argument of the outbox functions: NULL (22004), empty
-- names, headers that are not a JSON object, a deliver_at that is not
-- finite, batch and intervals out of range (22023), names over 255 bytes and
-- values over idempotency.max_value_bytes (22001), lengths in bytes. Runs in
-- a UTF8 database of its own, so that the claims that pass hand out nothing
-- of other tests and multibyte characters can be counted.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE DATABASE idem_outbox_val TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C';
\c idem_outbox_val
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- try(sql): runs one statement; 'ok', or 'SQLSTATE: message' (event ids
-- masked, runs of ten or more equal characters shortened).
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(regexp_replace(SQLERRM, 'event -?[0-9]+', 'event N', 'g'),
                                              '(.)\1{9,}', '\1\1\1...', 'g');
END $f$;
-- Each call runs alone; 'ok' means it was accepted. A call that fails
-- leaves nothing behind (checked below by counting the events).

-- ---------------------------------------------------------------- outbox_enqueue
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_enqueue(NULL, '{}')$c$),
    (2, $c$idempotency.outbox_enqueue('', '{}')$c$),
    (3, $c$idempotency.outbox_enqueue(repeat('t', 255), '{}')$c$),
    (4, $c$idempotency.outbox_enqueue(repeat('t', 256), '{}')$c$),
    (5, $c$idempotency.outbox_enqueue('val.t', NULL)$c$),
    (6, $c$idempotency.outbox_enqueue('val.t', 'null')$c$),
    (7, $c$idempotency.outbox_enqueue('val.t', '"s"')$c$),
    (8, $c$idempotency.outbox_enqueue('val.t', '[]')$c$),
    (9, $c$idempotency.outbox_enqueue('val.t', '{}', key => NULL)$c$),
    (10, $c$idempotency.outbox_enqueue('val.t', '{}', key => '')$c$),
    (11, $c$idempotency.outbox_enqueue('val.t', '{}', key => repeat('k', 255))$c$),
    (12, $c$idempotency.outbox_enqueue('val.t', '{}', key => repeat('k', 256))$c$),
    (13, $c$idempotency.outbox_enqueue('val.t', '{}', headers => NULL)$c$),
    (14, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '{}')$c$),
    (15, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '{"a": [1], "b": {"c": null}}')$c$),
    (16, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '[]')$c$),
    (17, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '[{"a": 1}]')$c$),
    (18, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '"a string"')$c$),
    (19, $c$idempotency.outbox_enqueue('val.t', '{}', headers => '1')$c$),
    (20, $c$idempotency.outbox_enqueue('val.t', '{}', headers => 'true')$c$),
    (21, $c$idempotency.outbox_enqueue('val.t', '{}', headers => 'null')$c$),
    (22, $c$idempotency.outbox_enqueue('val.t', '{}', dedup_key => NULL)$c$),
    (23, $c$idempotency.outbox_enqueue('val.t', '{}', dedup_key => '')$c$),
    (24, $c$idempotency.outbox_enqueue('val.t', '{}', dedup_key => repeat('d', 255))$c$),
    (25, $c$idempotency.outbox_enqueue('val.t', '{}', dedup_key => repeat('d', 256))$c$),
    (26, $c$idempotency.outbox_enqueue('val.t', '{}', deliver_at => NULL)$c$),
    (27, $c$idempotency.outbox_enqueue('val.t', '{}', deliver_at => 'infinity')$c$),
    (28, $c$idempotency.outbox_enqueue('val.t', '{}', deliver_at => '-infinity')$c$),
    (29, $c$idempotency.outbox_enqueue('val.t', '{}', deliver_at => clock_timestamp() - interval '1 year')$c$),
    (30, $c$idempotency.outbox_enqueue('val.t', '{}', deliver_at => clock_timestamp() + interval '1 year')$c$),
    (31, $c$idempotency.outbox_enqueue('val.t', '{}', 'k', '{}', 'd', NULL)$c$)
) v(n, call) ORDER BY n;
-- What was accepted is stored as given (1 per accepted call; 24 and 31 have
-- different dedup_keys).
SELECT octet_length(topic) AS topic_bytes, octet_length(key) AS key_bytes, payload, headers,
       octet_length(dedup_key) AS dedup_key_bytes, available_at > enqueued_at AS later
  FROM idempotency.outbox ORDER BY id;

-- ---------------------------------------------------------------- outbox_claim
-- batch 1..10000 (NULL: 100); lease positive and at most idempotency.max_lease
-- (1 day; NULL: idempotency.default_lease); topics NULL (every topic) or
-- valid topic names. Topic val.none has no events: nothing is handed out.
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_claim(NULL, topics => '{val.none}')$c$),
    (2, $c$idempotency.outbox_claim('', topics => '{val.none}')$c$),
    (3, $c$idempotency.outbox_claim(repeat('r', 255), topics => '{val.none}')$c$),
    (4, $c$idempotency.outbox_claim(repeat('r', 256), topics => '{val.none}')$c$),
    (5, $c$idempotency.outbox_claim('r', NULL, topics => '{val.none}')$c$),
    (6, $c$idempotency.outbox_claim('r', 0, topics => '{val.none}')$c$),
    (7, $c$idempotency.outbox_claim('r', -1, topics => '{val.none}')$c$),
    (8, $c$idempotency.outbox_claim('r', 1, topics => '{val.none}')$c$),
    (9, $c$idempotency.outbox_claim('r', 10000, topics => '{val.none}')$c$),
    (10, $c$idempotency.outbox_claim('r', 10001, topics => '{val.none}')$c$),
    (11, $c$idempotency.outbox_claim('r', -2147483648, topics => '{val.none}')$c$),
    (12, $c$idempotency.outbox_claim('r', 2147483647, topics => '{val.none}')$c$),
    (13, $c$idempotency.outbox_claim('r', lease => NULL, topics => '{val.none}')$c$),
    (14, $c$idempotency.outbox_claim('r', lease => '0', topics => '{val.none}')$c$),
    (15, $c$idempotency.outbox_claim('r', lease => '-1s', topics => '{val.none}')$c$),
    (16, $c$idempotency.outbox_claim('r', lease => '-1 day', topics => '{val.none}')$c$),
    (17, $c$idempotency.outbox_claim('r', lease => '1 microsecond', topics => '{val.none}')$c$),
    (18, $c$idempotency.outbox_claim('r', lease => '1 day', topics => '{val.none}')$c$),
    (19, $c$idempotency.outbox_claim('r', lease => '24:00:00.000001', topics => '{val.none}')$c$),
    (20, $c$idempotency.outbox_claim('r', lease => '1 mon', topics => '{val.none}')$c$),
    (21, $c$idempotency.outbox_claim('r', lease => '2147483647 days', topics => '{val.none}')$c$),
    (22, $c$idempotency.outbox_claim('r', lease => '-2147483648 mons', topics => '{val.none}')$c$),
    (23, $c$idempotency.outbox_claim('r', topics => '{}')$c$),
    (24, $c$idempotency.outbox_claim('r', topics => '{NULL}')$c$),
    (25, $c$idempotency.outbox_claim('r', topics => '{val.none,NULL}')$c$),
    (26, $c$idempotency.outbox_claim('r', topics => '{""}')$c$),
    (27, $c$idempotency.outbox_claim('r', topics => ARRAY['val.none', ''])$c$),
    (28, $c$idempotency.outbox_claim('r', topics => ARRAY[repeat('u', 255)])$c$),
    (29, $c$idempotency.outbox_claim('r', topics => ARRAY['val.none', repeat('t', 256)])$c$)
) v(n, call) ORDER BY n;
-- None of them handed anything out.
SELECT state, count(*) FROM idempotency.outbox GROUP BY state ORDER BY state;
-- The default lease stands in for a NULL one, and is checked against max_lease too.
SET idempotency.max_lease = '1 min';
SET idempotency.default_lease = '2 min';
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_claim('r', topics => '{val.none}')$c$),
    (2, $c$idempotency.outbox_claim('r', lease => '61s', topics => '{val.none}')$c$),
    (3, $c$idempotency.outbox_claim('r', lease => '1 min', topics => '{val.none}')$c$)
) v(n, call) ORDER BY n;
RESET idempotency.default_lease;
SELECT pg_temp.try($$SELECT idempotency.outbox_claim('r', topics => '{val.none}')$$);
RESET idempotency.max_lease;

-- Events to ack and nack.
CREATE TEMP TABLE ev AS
SELECT n, idempotency.outbox_enqueue('val.ev', jsonb_build_object('n', n)) AS id FROM generate_series(1, 4) n;
SELECT count(*) AS claimed FROM idempotency.outbox_claim('r', topics => '{val.ev}');
CREATE FUNCTION pg_temp.ev(i int) RETURNS bigint LANGUAGE sql AS $f$ SELECT id FROM ev WHERE n = i $f$;

-- ---------------------------------------------------------------- outbox_ack
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_ack(NULL)$c$),
    (2, $c$idempotency.outbox_ack('{NULL}')$c$),
    (3, $c$idempotency.outbox_ack(ARRAY[pg_temp.ev(1), NULL])$c$),
    (4, $c$idempotency.outbox_ack(ARRAY[NULL, pg_temp.ev(1)])$c$),
    (5, $c$idempotency.outbox_ack('{}')$c$),
    (6, $c$idempotency.outbox_ack(ARRAY[-1, 0, 9223372036854775807])$c$)
) v(n, call) ORDER BY n;
-- The refused calls changed nothing.
SELECT n, state FROM ev JOIN idempotency.outbox o USING (id) ORDER BY n;

-- ---------------------------------------------------------------- outbox_nack
-- error is bounded by idempotency.max_value_bytes and may be empty;
-- retryable NULL means the default (true); retry_in is between 0 and 100 years.
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_nack(NULL, 'e')$c$),
    (2, $c$idempotency.outbox_nack(pg_temp.ev(1), NULL)$c$),
    (3, $c$idempotency.outbox_nack(pg_temp.ev(1), 'e', retry_in => '-1 microsecond')$c$),
    (4, $c$idempotency.outbox_nack(pg_temp.ev(1), 'e', retry_in => '100 years 1 day')$c$),
    (5, $c$idempotency.outbox_nack(pg_temp.ev(1), 'e', retry_in => '1201 mons')$c$),
    (6, $c$idempotency.outbox_nack(pg_temp.ev(1), 'e', retry_in => '2147483647 days')$c$),
    (7, $c$idempotency.outbox_nack(pg_temp.ev(1), 'e', retry_in => '-2147483648 mons')$c$),
    (8, $c$idempotency.outbox_nack(-1, 'e')$c$),
    (9, $c$idempotency.outbox_nack(-1, NULL)$c$),
    (10, $c$idempotency.outbox_nack(-1, 'e', retry_in => '-1s')$c$),
    (11, $c$idempotency.outbox_nack(pg_temp.ev(1), '', true, '100 years')$c$),
    (13, $c$idempotency.outbox_nack(pg_temp.ev(3), 'e', NULL)$c$),
    (12, $c$idempotency.outbox_nack(pg_temp.ev(2), 'e', retry_in => '0')$c$)
) v(n, call) ORDER BY n;
-- 11 (retried in 100 years) and 12 were accepted; 13 (retryable NULL) was
-- refused and changed nothing.
SELECT n, state, attempts, last_error,
       CASE WHEN state = 'pending' THEN available_at - updated_at = interval '100 years' END AS in_100_years
  FROM ev JOIN idempotency.outbox o USING (id) ORDER BY n;

-- ---------------------------------------------------------------- outbox_redrive
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_redrive(NULL, NULL)$c$),
    (2, $c$idempotency.outbox_redrive('{NULL}')$c$),
    (3, $c$idempotency.outbox_redrive(ARRAY[pg_temp.ev(1), NULL])$c$),
    (4, $c$idempotency.outbox_redrive('{}')$c$),
    (5, $c$idempotency.outbox_redrive(topic => '')$c$),
    (6, $c$idempotency.outbox_redrive(topic => repeat('t', 255))$c$),
    (7, $c$idempotency.outbox_redrive(topic => repeat('t', 256))$c$),
    (8, $c$idempotency.outbox_redrive('{}', '')$c$)
) v(n, call) ORDER BY n;

-- ---------------------------------------------------------------- max_value_bytes
-- payload, headers (as jsonb) and the error of a nack are limited by
-- idempotency.max_value_bytes (a superuser setting; units accepted).
SET idempotency.max_value_bytes = '1kB';
SHOW idempotency.max_value_bytes;
-- A jsonb string of 1016 characters takes 1024 bytes, of 1017 takes 1025.
SELECT n, pg_column_size(to_jsonb(repeat('p', n))) - 4 AS jsonb_bytes FROM (VALUES (1016), (1017)) v(n);
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_enqueue('val.big', to_jsonb(repeat('p', 1017)))$c$),
    (2, $c$idempotency.outbox_enqueue('val.big', jsonb_build_object('rows', (SELECT jsonb_agg(g) FROM generate_series(1, 300) g)))$c$),
    (3, $c$idempotency.outbox_enqueue('val.big', '{}', headers => jsonb_build_object('h', repeat('h', 2000)))$c$),
    (4, $c$idempotency.outbox_nack(pg_temp.ev(3), repeat('e', 1025))$c$),
    (5, $c$idempotency.outbox_enqueue('val.big', to_jsonb(repeat('p', 1016)))$c$),
    (6, $c$idempotency.outbox_enqueue('val.big', '{}', headers => jsonb_build_object('h', repeat('h', 500)))$c$),
    (7, $c$idempotency.outbox_nack(pg_temp.ev(3), repeat('e', 1024), retry_in => '1 hour')$c$)
) v(n, call) ORDER BY n;
SELECT octet_length(payload::text) AS payload_text_bytes, octet_length(headers ->> 'h') AS header_chars
  FROM idempotency.outbox WHERE topic = 'val.big' ORDER BY id;
SELECT n, state, octet_length(last_error) AS error_bytes FROM ev JOIN idempotency.outbox o USING (id) WHERE n = 3;
RESET idempotency.max_value_bytes;
-- The default (1MB) lets those values through.
SELECT pg_temp.try($$SELECT idempotency.outbox_enqueue('val.big', to_jsonb(repeat('p', 100000)), headers => jsonb_build_object('h', repeat('h', 100000)))$$);
SELECT pg_temp.try($$SELECT idempotency.outbox_enqueue('val.big', to_jsonb(repeat('p', 2000000)))$$);

-- ---------------------------------------------------------------- bytes, not characters
-- 127 two-byte characters plus one ASCII byte are 255 bytes (accepted); 128
-- two-byte characters are 256 bytes (refused); so are 64 four-byte ones.
CREATE TEMP TABLE s AS
SELECT repeat(chr(233), 127) || 'a' AS n255, repeat(chr(233), 128) AS n256,
       repeat(chr(8364), 85) AS n255_3byte, repeat(chr(128512), 64) AS n256_4byte,
       repeat(chr(233), 512) AS e1024, repeat(chr(233), 512) || 'a' AS e1025;
SELECT char_length(n255) AS chars, octet_length(n255) AS bytes FROM s
UNION ALL SELECT char_length(n256), octet_length(n256) FROM s
UNION ALL SELECT char_length(n255_3byte), octet_length(n255_3byte) FROM s
UNION ALL SELECT char_length(n256_4byte), octet_length(n256_4byte) FROM s
UNION ALL SELECT char_length(e1025), octet_length(e1025) FROM s;
SELECT call, pg_temp.try('SELECT ' || call) AS result FROM (VALUES
    (1, $c$idempotency.outbox_enqueue((SELECT n255 FROM s), '{}', (SELECT n255_3byte FROM s), NULL, (SELECT n255 FROM s))$c$),
    (2, $c$idempotency.outbox_enqueue((SELECT n256 FROM s), '{}')$c$),
    (3, $c$idempotency.outbox_enqueue('val.mb', '{}', (SELECT n256 FROM s))$c$),
    (4, $c$idempotency.outbox_enqueue('val.mb', '{}', dedup_key => (SELECT n256_4byte FROM s))$c$),
    (5, $c$idempotency.outbox_claim((SELECT n255 FROM s), topics => ARRAY[(SELECT n255_3byte FROM s)])$c$),
    (6, $c$idempotency.outbox_claim((SELECT n256 FROM s), topics => '{val.none}')$c$),
    (7, $c$idempotency.outbox_claim('r', topics => ARRAY[(SELECT n256_4byte FROM s)])$c$),
    (8, $c$idempotency.outbox_redrive(topic => (SELECT n255 FROM s))$c$),
    (9, $c$idempotency.outbox_redrive(topic => (SELECT n256 FROM s))$c$)
) v(n, call) ORDER BY n;
SELECT octet_length(topic) AS topic_bytes, char_length(topic) AS topic_chars,
       octet_length(key) AS key_bytes, octet_length(dedup_key) AS dedup_key_bytes
  FROM idempotency.outbox WHERE topic = (SELECT n255 FROM s);
-- max_value_bytes counts bytes too.
SET idempotency.max_value_bytes = 1024;
SELECT pg_temp.try(format('SELECT idempotency.outbox_nack(%s, (SELECT e1025 FROM s))', pg_temp.ev(4)));
SELECT pg_temp.try(format('SELECT idempotency.outbox_nack(%s, (SELECT e1024 FROM s), false)', pg_temp.ev(4)));
SELECT n, state, char_length(last_error) AS chars, octet_length(last_error) AS bytes
  FROM ev JOIN idempotency.outbox o USING (id) WHERE n = 4;
RESET idempotency.max_value_bytes;
\c contrib_regression
DROP DATABASE idem_outbox_val;
