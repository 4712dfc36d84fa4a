-- Baselines of the outbox benchmarks in `make bench` (loaded after
-- baselines.sql, which creates schema bench): the tables a user would write
-- for a transactional outbox without the extension.
--
--   bench.outbox     the same columns, storage parameters (fillfactor,
--                    autovacuum) and indexes as idempotency.outbox: what a relay that keeps per-key
--                    order, leases and retention needs. run.sh checks that
--                    its index definitions still match the extension's.
--   bench.outbox_pk  the same columns and storage parameters, only the primary key:
--                    the cheapest possible INSERT, labelled as such.
--   bench.floor_outbox  the physical floor of an outbox: an event (topic,
--                    key, payload), its primary key and one partial index on
--                    the ids not yet published.
--
-- The hand-written relay (scripts/relay_plain.sql) claims the oldest ready
-- events with FOR UPDATE SKIP LOCKED and marks them delivered; the plain
-- INSERT makes every event ready (there is no per-key order), so it keeps
-- no per-key order and ignores deliver_at, which the extension's claim
-- honours.

SET client_min_messages = warning;

CREATE TYPE bench.outbox_state AS ENUM ('pending', 'in_flight', 'delivered', 'dead');

CREATE TABLE bench.outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text NOT NULL,
    key          text,
    payload      jsonb NOT NULL,
    headers      jsonb,
    dedup_key    text,
    state        bench.outbox_state NOT NULL DEFAULT 'pending',
    attempts     int NOT NULL DEFAULT 0,
    enqueued_at  timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    lease_until  timestamptz,
    relay        text,
    last_error   text,
    delivered_at timestamptz,
    updated_at   timestamptz NOT NULL,
    max_attempts int,
    ready_at     timestamptz,
    key_seq      bigint
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX outbox_ready ON bench.outbox (topic, ready_at, id)
    WHERE ready_at IS NOT NULL;
CREATE INDEX outbox_ready_all ON bench.outbox (ready_at, id)
    WHERE ready_at IS NOT NULL;
CREATE INDEX outbox_key_order ON bench.outbox
    (pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(topic, 0)),
     (COALESCE(key_seq, id)), id)
    WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL;
CREATE INDEX outbox_in_flight ON bench.outbox (lease_until)
    WHERE state = 'in_flight';
CREATE UNIQUE INDEX outbox_dedup ON bench.outbox (topic, dedup_key)
    WHERE dedup_key IS NOT NULL;
CREATE INDEX outbox_delivered ON bench.outbox (delivered_at)
    WHERE state = 'delivered';

CREATE TABLE bench.outbox_pk (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text NOT NULL,
    key          text,
    payload      jsonb NOT NULL,
    headers      jsonb,
    dedup_key    text,
    state        bench.outbox_state NOT NULL DEFAULT 'pending',
    attempts     int NOT NULL DEFAULT 0,
    enqueued_at  timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    lease_until  timestamptz,
    relay        text,
    last_error   text,
    delivered_at timestamptz,
    updated_at   timestamptz NOT NULL,
    max_attempts int,
    ready_at     timestamptz,
    key_seq      bigint
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

CREATE TABLE bench.floor_outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text NOT NULL,
    key          text,
    payload      jsonb NOT NULL,
    published_at timestamptz
);
CREATE INDEX floor_outbox_unpublished ON bench.floor_outbox (id) WHERE published_at IS NULL;

-- Index definitions of a table with the schema names taken out, one per
-- line, in name order: equal for idempotency.outbox and bench.outbox.
CREATE FUNCTION bench.index_shape(rel regclass) RETURNS SETOF text
LANGUAGE sql STABLE
AS $$
    SELECT regexp_replace(pg_get_indexdef(i.indexrelid), '\m(idempotency|bench)\.', '', 'g')
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = rel
     ORDER BY c.relname;
$$;

-- The key of the backlog's i-th event: one of `keys` values, none (0), or
-- a key of its own (-1).
CREATE FUNCTION bench.backlog_key(i int, keys int) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN keys > 0 THEN (1 + abs(hashint4(i)) % keys)::text
                   WHEN keys < 0 THEN i::text END $$;

-- The backlog of the relay benchmark: n pending events in idempotency.outbox
-- (target 'extension') or bench.outbox (target 'plain'), rows as
-- outbox_enqueue writes them: topic 'orders', keys spread pseudo-randomly
-- over `keys` values (the same sequence in both tables; 0: no key; -1: a key
-- per event), a small
-- payload, due now. In idempotency.outbox the first event of each key is its
-- head (ready_at, 0.5.0 on); in bench.outbox every event is ready.
CREATE FUNCTION bench.outbox_prefill(n int, target text, keys int DEFAULT 1000) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF target = 'plain' THEN
        INSERT INTO bench.outbox (topic, key, payload, enqueued_at, available_at, updated_at, ready_at)
        SELECT 'orders', bench.backlog_key(i, keys),
               jsonb_build_object('order', i, 'amount', 1999, 'currency', 'EUR'),
               clock_timestamp(), clock_timestamp(), clock_timestamp(), clock_timestamp()
          FROM generate_series(1, n) AS i;
    ELSIF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idempotency.outbox'::regclass
                     AND attname = 'ready_at' AND NOT attisdropped) THEN
        EXECUTE 'INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at,
                                                 updated_at, ready_at)
                 SELECT ''orders'', k, jsonb_build_object(''order'', i, ''amount'', 1999, ''currency'', ''EUR''),
                        clock_timestamp(), clock_timestamp(), clock_timestamp(),
                        CASE WHEN k IS NULL OR row_number() OVER (PARTITION BY k ORDER BY i) = 1
                             THEN clock_timestamp() END
                   FROM (SELECT i, bench.backlog_key(i, $2) AS k
                           FROM generate_series(1, $1) AS i) e ORDER BY i' USING n, keys;
    ELSE
        INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at, updated_at)
        SELECT 'orders', bench.backlog_key(i, keys),
               jsonb_build_object('order', i, 'amount', 1999, 'currency', 'EUR'),
               clock_timestamp(), clock_timestamp(), clock_timestamp()
          FROM generate_series(1, n) AS i;
    END IF;
END $$;
