-- The outbox's queue cases of `make bench` (sections queue and producers in
-- test/bench/queue.sh): backlogs that other relays' work must not pay for.
-- Pending events are written with one INSERT ... SELECT each, as
-- outbox_enqueue writes them (for speed): from 0.5.0 the first event of
-- each key is its head (ready_at) and the others wait (no ready_at); before
-- 0.5.0 there is no such column.

-- Whether the installed outbox has the ready queue (0.5.0).
CREATE FUNCTION bench.ready_queue() RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'idempotency.outbox'::regclass AND attname = 'ready_at'
                      AND NOT attisdropped) $$;

-- `n` pending events of `topic`: keys from `keys` values ('k1' ...), or no
-- key when keys = 0; or all of key `one_key` when given.
CREATE FUNCTION bench.queue_fill(n bigint, topic text, keys int, one_key text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    key_expr text := CASE WHEN one_key IS NOT NULL THEN quote_literal(one_key)
                          WHEN keys = 0 THEN 'NULL'
                          ELSE '''k'' || (i % ' || keys || ')' END;
    -- Heads: every event without a key; the first event of each key.
    head_expr text := CASE WHEN one_key IS NOT NULL THEN 'false'
                           WHEN keys = 0 THEN 'true'
                           ELSE 'i <= ' || keys END;
BEGIN
    IF bench.ready_queue() THEN
        EXECUTE format(
            'INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at, updated_at, ready_at)
             SELECT %L, %s, jsonb_build_object(''i'', i), clock_timestamp(), clock_timestamp(),
                    clock_timestamp(), CASE WHEN %s THEN clock_timestamp() END
               FROM generate_series(1, %s) i', topic, key_expr, head_expr, n);
    ELSE
        EXECUTE format(
            'INSERT INTO idempotency.outbox (topic, key, payload, enqueued_at, available_at, updated_at)
             SELECT %L, %s, jsonb_build_object(''i'', i), clock_timestamp(), clock_timestamp(),
                    clock_timestamp()
               FROM generate_series(1, %s) i', topic, key_expr, n);
    END IF;
END $$;

-- One blocked key: its head enqueued and claimed by another relay with a
-- long lease (in flight, committed), and `behind` events waiting after it.
CREATE PROCEDURE bench.queue_block(topic text, behind bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idempotency.outbox_enqueue(topic, '{"head": true}', 'stuck');
    COMMIT;
    PERFORM count(*) FROM idempotency.outbox_claim('bench-blocker', 1, '1 hour', ARRAY[topic]);
    COMMIT;
    IF behind > 0 THEN
        PERFORM bench.queue_fill(behind, topic, 0, 'stuck');
    END IF;
    COMMIT;
END $$;

-- `n` delivered events whose index entries are dead and not vacuumed: made
-- pending (ready), then all marked delivered in one UPDATE, as acks do.
CREATE PROCEDURE bench.queue_dead(topic text, n bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM bench.queue_fill(n, topic, 0);
    COMMIT;
    IF bench.ready_queue() THEN
        EXECUTE 'UPDATE idempotency.outbox SET state = ''delivered'', delivered_at = now(),
                        ready_at = NULL, attempts = 1 WHERE topic = $1' USING topic;
    ELSE
        UPDATE idempotency.outbox o SET state = 'delivered', delivered_at = now(), attempts = 1
         WHERE o.topic = queue_dead.topic;
    END IF;
    COMMIT;
END $$;

CREATE TABLE bench.claim_times (label text NOT NULL, ms float8 NOT NULL, handed int NOT NULL,
                                index_pages bigint NOT NULL, first boolean NOT NULL);

-- `rounds` claims of `batch` events of `topics` by one relay, each acked in
-- its claim's transaction (as a relay does), timed around the claim alone.
-- The first claim of the session is kept apart (it may read from the
-- start of the ready index; later ones start where the last found events).
CREATE PROCEDURE bench.claim_loop(label text, topics text[], rounds int, batch int DEFAULT 100)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    ms float8;
    ids bigint[];
    pages0 bigint;
    pages bigint;
BEGIN
    FOR r IN 1 .. rounds LOOP
        SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(i.indexrelid)), 0) INTO pages0
          FROM pg_index i WHERE i.indrelid = 'idempotency.outbox'::regclass;
        t0 := clock_timestamp();
        ids := ARRAY(SELECT c.id FROM idempotency.outbox_claim('bench-relay', batch, '1 min', topics) c);
        ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
        SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(i.indexrelid)), 0) - pages0 INTO pages
          FROM pg_index i WHERE i.indrelid = 'idempotency.outbox'::regclass;
        PERFORM idempotency.outbox_ack(ids);
        INSERT INTO bench.claim_times VALUES (label, ms, cardinality(ids), pages, r = 1);
        COMMIT;
    END LOOP;
END $$;

-- Median and 99th percentile claim latency (ms) of a label, its first
-- claim, and the median index pages a claim read.
CREATE FUNCTION bench.claim_summary(p_label text,
    OUT median_ms float8, OUT p99_ms float8, OUT first_ms float8, OUT pages float8, OUT handed float8)
LANGUAGE sql AS $$
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FILTER (WHERE NOT first),
           percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) FILTER (WHERE NOT first),
           max(ms) FILTER (WHERE first),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY index_pages) FILTER (WHERE NOT first),
           avg(handed) FILTER (WHERE NOT first)
      FROM bench.claim_times WHERE label = p_label $$;

-- Producers: `keys` keyed events in one transaction, in ascending or
-- descending key order (the crossing-order and disjoint-keys cases).
CREATE PROCEDURE bench.enqueue_keys(prefix text, keys int, descending boolean)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. keys LOOP
        PERFORM idempotency.outbox_enqueue('bench', '{}',
            prefix || lpad((CASE WHEN descending THEN keys + 1 - i ELSE i END)::text, 5, '0'));
    END LOOP;
END $$;
