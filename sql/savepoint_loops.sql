-- Many subtransactions in one transaction, as a batch job writes them: a
-- PL/pgSQL loop whose every turn is an exception block (a subtransaction),
-- some of them nested, some rolled back. What each turn enqueued, claimed
-- or completed must be kept or taken back with its own turn only, however
-- many turns came before it: the outbox's heads (one ready event per key)
-- and the counts behind outbox_lag and idem_stats equal the tables after.
\set VERBOSITY terse

-- 300 turns over 7 keys of one topic and 150 topics of their own; every
-- fifth turn raises after its enqueues and is taken back, and every third
-- enqueues once more inside a nested block, which every ninth rolls back.
DO $$
BEGIN
  FOR i IN 1..300 LOOP
    BEGIN
      PERFORM idempotency.outbox_enqueue('sl.k', jsonb_build_object('i', i), 'k' || (i % 7));
      IF i <= 150 THEN
        PERFORM idempotency.outbox_enqueue('sl.t' || i, jsonb_build_object('i', i));
      END IF;
      IF i % 3 = 0 THEN
        BEGIN
          PERFORM idempotency.outbox_enqueue('sl.k', jsonb_build_object('i', -i), 'k' || (i % 7));
          IF i % 9 = 0 THEN
            RAISE EXCEPTION 'inner %', i;
          END IF;
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
      END IF;
      IF i % 5 = 0 THEN
        RAISE EXCEPTION 'turn %', i;
      END IF;
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
END $$;

-- Kept: the enqueues of the turns not divisible by 5, and of those the
-- nested ones of the turns divisible by 3 but not by 9 (the second query
-- counts what the rules keep).
SELECT count(*) FILTER (WHERE (payload->>'i')::int > 0) AS outer_kept,
       count(*) FILTER (WHERE (payload->>'i')::int < 0) AS nested_kept,
       count(*) FILTER (WHERE (payload->>'i')::int % 5 = 0) AS from_rolled_back_turns,
       count(*) FILTER (WHERE (payload->>'i')::int < 0 AND (payload->>'i')::int % 9 = 0)
           AS from_rolled_back_blocks
  FROM idempotency.outbox WHERE topic = 'sl.k';
SELECT count(*) FILTER (WHERE i % 5 <> 0) AS outer_expected,
       count(*) FILTER (WHERE i % 5 <> 0 AND i % 3 = 0 AND i % 9 <> 0) AS nested_expected
  FROM generate_series(1, 300) i;
SELECT count(*) AS topics_kept, count(*) FILTER (WHERE (payload->>'i')::int % 5 = 0) AS wrong
  FROM idempotency.outbox WHERE topic LIKE 'sl.t%';

-- One ready event per key, its oldest; a claim hands out exactly those.
SELECT key, count(*) FILTER (WHERE ready_at IS NOT NULL) AS ready,
       min(id) = min(id) FILTER (WHERE ready_at IS NOT NULL) AS oldest_is_ready
  FROM idempotency.outbox WHERE topic = 'sl.k' GROUP BY key ORDER BY key;
SELECT count(*) AS claimed, count(DISTINCT key) AS keys,
       bool_and(id = (SELECT min(o.id) FROM idempotency.outbox o
                       WHERE o.topic = 'sl.k' AND o.key = c.key)) AS each_the_oldest
  FROM idempotency.outbox_claim('sl-relay', 100, '1 minute', topics => '{sl.k}') c;

-- The counts kept by the commits equal the table's.
SELECT (SELECT sum(pending + in_flight + retrying) FROM idempotency.outbox_lag
         WHERE topic LIKE 'sl.%') =
       (SELECT count(*) FROM idempotency.outbox
         WHERE topic LIKE 'sl.%' AND state IN ('pending', 'in_flight')) AS outbox_counts_agree,
       (SELECT count(*) FROM idempotency.outbox_lag WHERE topic LIKE 'sl.t%') AS topics_in_view;

-- Keys: 200 turns, each claiming and completing a key in a scope of its
-- own; every fourth turn rolls back, and every sixth completes a second
-- key in a nested block that rolls back.
DO $$
DECLARE
  t bigint;
BEGIN
  FOR i IN 1..200 LOOP
    BEGIN
      SELECT token INTO t FROM idempotency.idem_claim('sl-key', scope => 'sl-s' || i);
      PERFORM idempotency.idem_complete('sl-key', t, jsonb_build_object('i', i), scope => 'sl-s' || i);
      IF i % 6 = 0 THEN
        BEGIN
          SELECT token INTO t FROM idempotency.idem_claim('sl-inner', scope => 'sl-s' || i);
          PERFORM idempotency.idem_complete('sl-inner', t, '{}', scope => 'sl-s' || i);
          RAISE EXCEPTION 'inner %', i;
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
      END IF;
      IF i % 4 = 0 THEN
        RAISE EXCEPTION 'turn %', i;
      END IF;
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
END $$;
SELECT count(*) AS completed, count(*) FILTER (WHERE key = 'sl-inner') AS inner_kept
  FROM idempotency.idempotency_keys WHERE scope LIKE 'sl-s%' AND status = 'COMPLETED';
SELECT (SELECT sum(completed) FROM idempotency.idem_stats WHERE scope LIKE 'sl-s%') AS in_view,
       (SELECT count(*) FROM idempotency.idem_stats WHERE scope LIKE 'sl-s%' AND completed = 1)
           AS scopes_with_one;

-- Memory: PostgreSQL keeps a committed subtransaction's memory context
-- until the top transaction ends when anything was allocated in it. A
-- loop of 2,000 savepoints that enqueue and complete must not keep one
-- per savepoint (8 kB each: gigabytes for a batch of a million).
-- Notifications off: a NOTIFY (the SQL edition's enqueue sends one) is
-- kept in that context by PostgreSQL itself.
BEGIN;
SET LOCAL idempotency.outbox_notify = off;
DO $$
DECLARE
  t bigint;
BEGIN
  FOR i IN 1..2000 LOOP
    BEGIN
      PERFORM idempotency.outbox_enqueue('sl.m', '{}', 'm' || (i % 10));
      PERFORM idempotency.outbox_enqueue('sl.m' || (i % 10), '{}');
      SELECT token INTO t FROM idempotency.idem_claim('sl-m' || i, scope => 'sl-m' || (i % 10));
      PERFORM idempotency.idem_complete('sl-m' || i, t, '{}', scope => 'sl-m' || (i % 10));
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
END $$;
SELECT count(*) < 20 AS few_subtransaction_contexts_kept
  FROM pg_backend_memory_contexts WHERE name = 'CurTransactionContext';
ROLLBACK;
