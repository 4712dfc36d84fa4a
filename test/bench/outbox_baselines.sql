-- Baselines of the outbox benchmarks in `make bench` (loaded after
-- baselines.sql, which creates schema bench): the tables a user would write
-- for a transactional outbox without the extension.
--
--   bench.outbox     the same columns, fillfactor and indexes as
--                    idempotency.outbox: what a relay that keeps per-key
--                    order, leases and retention needs. run.sh checks that
--                    its index definitions still match the extension's.
--   bench.outbox_pk  the same columns and fillfactor, only the primary key:
--                    the cheapest possible INSERT, labelled as such.
--
-- The hand-written relay (scripts/relay_plain.sql) claims the oldest pending
-- events with FOR UPDATE SKIP LOCKED and marks them delivered; it keeps no
-- per-key order and ignores deliver_at, which the extension's claim honours.

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
    updated_at   timestamptz NOT NULL
) WITH (fillfactor = 80);

CREATE INDEX outbox_live ON bench.outbox (id)
    WHERE state IN ('pending', 'in_flight');
CREATE INDEX outbox_key_chain ON bench.outbox (topic, key, id)
    WHERE state IN ('pending', 'in_flight') AND key IS NOT NULL;
CREATE INDEX outbox_in_flight ON bench.outbox (topic, key, lease_until)
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
    updated_at   timestamptz NOT NULL
) WITH (fillfactor = 80);

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

-- The backlog of the relay benchmark: n pending events in idempotency.outbox
-- (target 'extension') or bench.outbox (target 'plain'), rows as
-- outbox_enqueue writes them: topic 'orders', keys spread pseudo-randomly
-- over 1000 values (the same sequence in both tables), a small payload, due
-- now.
CREATE FUNCTION bench.outbox_prefill(n int, target text) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at, updated_at)
    SELECT 'orders', (1 + abs(hashint4(i)) % 1000)::text,
           jsonb_build_object('order', i, 'amount', 1999, 'currency', 'EUR'),
           clock_timestamp(), clock_timestamp(), clock_timestamp()
      FROM generate_series(1, n) AS i
     WHERE target = 'extension';
    INSERT INTO bench.outbox (topic, key, payload, enqueued_at, available_at, updated_at)
    SELECT 'orders', (1 + abs(hashint4(i)) % 1000)::text,
           jsonb_build_object('order', i, 'amount', 1999, 'currency', 'EUR'),
           clock_timestamp(), clock_timestamp(), clock_timestamp()
      FROM generate_series(1, n) AS i
     WHERE target = 'plain';
$$;
