-- idem_metrics: each counter counts exactly what happened. The counters are
-- cluster-wide and pg_regress runs the tests of this suite one at a time, so
-- the deltas printed here are exact. Every block prints the counters that
-- moved since the previous block (and nothing else moves): counters of state
-- changes count only what committed, counters of answers count every answer.
-- Runs in a database of its own so that idem_maintenance() sees only the keys
-- made here.
CREATE DATABASE idem_metrics;
\c idem_metrics
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
-- Leases are long unless a block makes them short on purpose.
SET idempotency.default_lease = '1h';
CREATE TEMP TABLE t (label text PRIMARY KEY, token bigint);
CREATE FUNCTION pg_temp.tok(p_label text) RETURNS bigint LANGUAGE sql STABLE
    AS $$ SELECT token FROM t WHERE label = p_label $$;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $f$;
-- The counters as they were at the end of the previous block.
CREATE TEMP TABLE snap (m jsonb);
CREATE FUNCTION pg_temp.snap() RETURNS void LANGUAGE sql AS $$
    DELETE FROM snap;
    INSERT INTO snap SELECT to_jsonb(m) FROM idempotency.idem_metrics m;
$$;
-- The counters that moved since the last snapshot (after - before), then a
-- new snapshot. processing_ms_sum depends on timing: it is checked where a
-- block controls the time. The buckets are shown by their sum (which bucket
-- a quick complete lands in depends on timing too) and checked one by one
-- where a block controls the time.
CREATE FUNCTION pg_temp.deltas() RETURNS TABLE (counter text, delta bigint) LANGUAGE plpgsql AS $f$
DECLARE
    now_m jsonb;
    old_m jsonb;
BEGIN
    SELECT to_jsonb(m) INTO now_m FROM idempotency.idem_metrics m;
    SELECT s.m INTO old_m FROM snap s;
    RETURN QUERY
    SELECT c.counter, c.delta FROM (
        SELECT a.key AS counter, (a.value #>> '{}')::bigint - (old_m -> a.key #>> '{}')::bigint AS delta
          FROM jsonb_each(now_m) a
         WHERE a.key NOT IN ('stats_reset', 'processing_ms_sum', 'processing_ms_buckets')
        UNION ALL
        SELECT 'processing_ms_buckets (sum)',
               (SELECT sum(x::bigint) FROM jsonb_array_elements_text(now_m -> 'processing_ms_buckets') x)::bigint -
               (SELECT sum(x::bigint) FROM jsonb_array_elements_text(old_m -> 'processing_ms_buckets') x)::bigint
    ) c WHERE c.delta <> 0 ORDER BY c.counter COLLATE "C";
    PERFORM pg_temp.snap();
END $f$;
-- processing_ms_buckets and processing_ms_sum moved since a saved snapshot.
CREATE TEMP TABLE saved (label text PRIMARY KEY, m jsonb);
CREATE FUNCTION pg_temp.save(p_label text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO saved SELECT p_label, to_jsonb(m) FROM idempotency.idem_metrics m
        ON CONFLICT (label) DO UPDATE SET m = excluded.m;
$$;
CREATE FUNCTION pg_temp.bucket_deltas(p_label text) RETURNS bigint[] LANGUAGE sql AS $$
    SELECT array_agg((a.x)::bigint - (b.x)::bigint ORDER BY a.n)
      FROM jsonb_array_elements_text((SELECT to_jsonb(m) -> 'processing_ms_buckets' FROM idempotency.idem_metrics m))
           WITH ORDINALITY a(x, n)
      JOIN jsonb_array_elements_text((SELECT s.m -> 'processing_ms_buckets' FROM saved s WHERE s.label = p_label))
           WITH ORDINALITY b(x, n) USING (n)
$$;
CREATE FUNCTION pg_temp.ms_sum_delta(p_label text) RETURNS bigint LANGUAGE sql AS $$
    SELECT m.processing_ms_sum - (s.m ->> 'processing_ms_sum')::bigint
      FROM idempotency.idem_metrics m, saved s WHERE s.label = p_label
$$;

-- ---------------------------------------------------------------- the view
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.idem_metrics'::regclass AND a.attnum > 0
 ORDER BY a.attnum;
SELECT count(*) AS rows FROM idempotency.idem_metrics;

-- ---------------------------------------------------------------- reset
-- idem_metrics_reset() zeroes every counter and moves stats_reset.
SELECT stats_reset AS reset_before FROM idempotency.idem_metrics \gset
SELECT pg_sleep(0.01);
SELECT idempotency.idem_metrics_reset();
SELECT stats_reset > :'reset_before'::timestamptz AS stats_reset_moved,
       stats_reset <= clock_timestamp() AS stats_reset_not_in_future,
       claims = 0 AND replays = 0 AND in_progress = 0 AND mismatches = 0 AND completions = 0 AND
       failures_retryable = 0 AND failures_final = 0 AND lease_expirations = 0 AND
       late_completions = 0 AND stale_tokens = 0 AND inbox_duplicates = 0 AND
       outbox_enqueued = 0 AND outbox_deduplicated = 0 AND outbox_delivered = 0 AND
       outbox_retried = 0 AND outbox_dead = 0 AND locks_acquired = 0 AND locks_contended = 0 AND
       processing_count = 0 AND processing_ms_sum = 0 AS counters_zero,
       processing_ms_buckets = '{0,0,0,0,0,0,0,0,0,0}' AS buckets_zero
  FROM idempotency.idem_metrics;
SELECT pg_temp.snap();
SELECT pg_temp.save('start');
-- Reading the metrics counts nothing.
SELECT count(*) AS rows FROM idempotency.idem_metrics;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- claims granted
-- A new key.
INSERT INTO t SELECT 'new', token FROM idempotency.idem_claim('m-new');
SELECT * FROM pg_temp.deltas();
-- A registered key (RECEIVED): register itself counts nothing, the claim counts.
SELECT outcome FROM idempotency.idem_register('m-reg');
SELECT * FROM pg_temp.deltas();
SELECT outcome, attempt FROM idempotency.idem_claim('m-reg');
SELECT * FROM pg_temp.deltas();
-- A takeover of an expired lease: a claim and a lease expiration.
INSERT INTO t SELECT 'take-1', token FROM idempotency.idem_claim('m-take', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM pg_temp.deltas();
SELECT outcome, attempt FROM idempotency.idem_claim('m-take');
SELECT * FROM pg_temp.deltas();
-- A retry: a retryable failure, then a claim once its backoff has passed.
INSERT INTO t SELECT 'retry', token FROM idempotency.idem_claim('m-retry');
SELECT idempotency.idem_fail('m-retry', pg_temp.tok('retry'), 'boom', retry_in => '0');
SELECT * FROM pg_temp.deltas();
SELECT outcome, attempt FROM idempotency.idem_claim('m-retry');
SELECT * FROM pg_temp.deltas();
-- A release counts nothing (the claim it gives back stays counted).
INSERT INTO t SELECT 'rel', token FROM idempotency.idem_claim('m-rel');
SELECT idempotency.idem_release('m-rel', pg_temp.tok('rel'));
SELECT * FROM pg_temp.deltas();
-- A heartbeat counts nothing.
SELECT idempotency.idem_heartbeat('m-new', pg_temp.tok('new')) > now() AS renewed;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- replays
INSERT INTO t SELECT 'done', token FROM idempotency.idem_claim('m-done', '{"a": 1}');
SELECT outcome FROM idempotency.idem_complete('m-done', pg_temp.tok('done'), '"r"');
SELECT * FROM pg_temp.deltas();
-- A duplicate claim of the COMPLETED key.
SELECT outcome, result FROM idempotency.idem_claim('m-done', '{"a": 1}');
SELECT * FROM pg_temp.deltas();
-- A register of the completed key.
SELECT outcome, result FROM idempotency.idem_register('m-done');
SELECT * FROM pg_temp.deltas();
-- A repeated complete with the same token.
SELECT outcome, result FROM idempotency.idem_complete('m-done', pg_temp.tok('done'), '"r"');
SELECT * FROM pg_temp.deltas();
-- A FAILED_FINAL key answers `failed`: no counter.
INSERT INTO t SELECT 'dead', token FROM idempotency.idem_claim('m-dead');
SELECT idempotency.idem_fail('m-dead', pg_temp.tok('dead'), 'fatal', false);
SELECT * FROM pg_temp.deltas();
SELECT outcome, error FROM idempotency.idem_claim('m-dead');
SELECT outcome, error FROM idempotency.idem_register('m-dead');
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- in_progress
-- A live lease: claim and register answer in_progress.
INSERT INTO t SELECT 'busy', token FROM idempotency.idem_claim('m-busy', lease => '1h');
SELECT * FROM pg_temp.deltas();
SELECT outcome FROM idempotency.idem_claim('m-busy');
SELECT outcome FROM idempotency.idem_register('m-busy');
SELECT * FROM pg_temp.deltas();
-- A RECEIVED key: register answers in_progress.
SELECT outcome FROM idempotency.idem_register('m-reg-2');
SELECT outcome FROM idempotency.idem_register('m-reg-2');
SELECT * FROM pg_temp.deltas();
-- A claim that waits counts one answer, however often it looked.
SELECT outcome, clock_timestamp() - statement_timestamp() >= interval '100ms' AS waited
  FROM idempotency.idem_claim('m-busy', wait => '100ms');
SELECT * FROM pg_temp.deltas();
-- retry_later: FAILED_RETRYABLE before its backoff has passed.
INSERT INTO t SELECT 'later', token FROM idempotency.idem_claim('m-later');
SELECT idempotency.idem_fail('m-later', pg_temp.tok('later'), 'not yet', retry_in => '1h');
SELECT * FROM pg_temp.deltas();
SELECT outcome FROM idempotency.idem_claim('m-later');
SELECT outcome FROM idempotency.idem_register('m-later');
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- mismatches
INSERT INTO t SELECT 'fp', token FROM idempotency.idem_claim('m-fp', '{"a": 1}');
SELECT * FROM pg_temp.deltas();
SELECT outcome FROM idempotency.idem_claim('m-fp', '{"a": 2}');
SELECT outcome FROM idempotency.idem_register('m-fp', '{"a": 2}');
-- ... also of a completed key: a mismatch, not a replay.
SELECT outcome FROM idempotency.idem_claim('m-done', '{"a": 2}');
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- completions
-- Claim-to-complete time: a complete 60 ms after its claim lands in the
-- <= 100 ms bucket (bounds 1, 5, 10, 50, 100, 500, 1000, 5000, 10000, +inf).
SELECT pg_temp.save('slow');
DO $$
DECLARE tok bigint;
BEGIN
    tok := (idempotency.idem_claim('m-slow')).token;
    PERFORM pg_sleep(0.06);
    PERFORM idempotency.idem_complete('m-slow', tok);
END $$;
SELECT * FROM pg_temp.deltas();
SELECT pg_temp.bucket_deltas('slow') AS bucket_deltas,
       pg_temp.ms_sum_delta('slow') BETWEEN 60 AND 100 AS ms_sum_60_to_100;
-- A complete 100 ms (and a few microseconds) after its claim took more than
-- 100 ms: it lands in the <= 500 ms bucket.
SELECT pg_temp.save('slower');
DO $$
DECLARE tok bigint;
BEGIN
    tok := (idempotency.idem_claim('m-slower')).token;
    PERFORM pg_sleep(0.1);
    PERFORM idempotency.idem_complete('m-slower', tok);
END $$;
SELECT * FROM pg_temp.deltas();
SELECT pg_temp.bucket_deltas('slower') AS bucket_deltas,
       pg_temp.ms_sum_delta('slower') BETWEEN 100 AND 500 AS ms_sum_100_to_500;
-- A late complete (the lease has passed, nobody claimed since): a completion
-- and a late completion.
INSERT INTO t SELECT 'late', token FROM idempotency.idem_claim('m-late', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM pg_temp.deltas();
SELECT outcome FROM idempotency.idem_complete('m-late', pg_temp.tok('late'));
SELECT * FROM pg_temp.deltas();
-- A complete before the lease ends is not late.
INSERT INTO t SELECT 'ontime', token FROM idempotency.idem_claim('m-ontime', lease => '1h');
SELECT outcome FROM idempotency.idem_complete('m-ontime', pg_temp.tok('ontime'));
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- failures
INSERT INTO t SELECT 'f1', token FROM idempotency.idem_claim('m-f1');
SELECT idempotency.idem_fail('m-f1', pg_temp.tok('f1'), 'again', retry_in => '0');
SELECT * FROM pg_temp.deltas();
INSERT INTO t SELECT 'f2', token FROM idempotency.idem_claim('m-f2');
SELECT idempotency.idem_fail('m-f2', pg_temp.tok('f2'), 'fatal', retryable => false);
SELECT * FROM pg_temp.deltas();
-- Attempts exhausted: a retryable failure becomes final.
SET idempotency.max_attempts = 1;
INSERT INTO t SELECT 'f3', token FROM idempotency.idem_claim('m-f3');
SELECT idempotency.idem_fail('m-f3', pg_temp.tok('f3'), 'again');
RESET idempotency.max_attempts;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- lease expirations
-- Expiry to FAILED_FINAL by a claim (attempts exhausted): no claim granted.
SET idempotency.max_attempts = 1;
INSERT INTO t SELECT 'x1', token FROM idempotency.idem_claim('m-x1', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM pg_temp.deltas();
SELECT outcome, status, error FROM idempotency.idem_claim('m-x1');
RESET idempotency.max_attempts;
SELECT * FROM pg_temp.deltas();
-- Expiry by idem_maintenance(): two leases run out; the live ones stay.
INSERT INTO t SELECT 'x2', token FROM idempotency.idem_claim('m-x2', lease => '50ms');
INSERT INTO t SELECT 'x3', token FROM idempotency.idem_claim('m-x3', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM pg_temp.deltas();
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.deltas();
-- The holder of an expired lease completes late (nobody claimed since).
SELECT outcome FROM idempotency.idem_complete('m-x2', pg_temp.tok('x2'));
SELECT * FROM pg_temp.deltas();
-- A sweep with nothing to expire counts nothing.
SELECT count(*) AS tasks FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- stale tokens
-- Each IK001 counts once; IK002 and IK003 do not count.
INSERT INTO t SELECT 's', token FROM idempotency.idem_claim('m-stale', lease => '1h');
SELECT * FROM pg_temp.deltas();
SELECT n, fn, pg_temp.try(call) AS sqlstate FROM (VALUES
    (1, 'idem_complete', format('SELECT idempotency.idem_complete(%L, %s)', 'm-stale', pg_temp.tok('s') + 1)),
    (2, 'idem_fail', format('SELECT idempotency.idem_fail(%L, %s, %L)', 'm-stale', pg_temp.tok('s') + 1, 'e')),
    (3, 'idem_heartbeat', format('SELECT idempotency.idem_heartbeat(%L, %s)', 'm-stale', pg_temp.tok('s') + 1)),
    (4, 'idem_release', format('SELECT idempotency.idem_release(%L, %s)', 'm-stale', pg_temp.tok('s') + 1)),
    (5, 'idem_assert_owner', format('SELECT idempotency.idem_assert_owner(%L, %s)', 'm-stale', pg_temp.tok('s') + 1)),
    (6, 'idem_lock_assert', format('SELECT idempotency.idem_lock_assert(%L, 1)', 'm-no-such-lock'))
  ) v(n, fn, call) ORDER BY n;
SELECT * FROM pg_temp.deltas();
-- The taken-over holder (m-take) and the holder of a completed key asserting ownership.
SELECT pg_temp.try(format('SELECT idempotency.idem_complete(%L, %s)', 'm-take', pg_temp.tok('take-1'))) AS taken_over,
       pg_temp.try(format('SELECT idempotency.idem_assert_owner(%L, %s)', 'm-done', pg_temp.tok('done'))) AS completed_key;
SELECT * FROM pg_temp.deltas();
-- IK002 (no such key) and IK003 (wrong state) are not stale tokens.
SELECT pg_temp.try($$SELECT idempotency.idem_complete('m-missing', 1)$$) AS missing,
       pg_temp.try(format('SELECT idempotency.idem_complete(%L, %s)', 'm-f2', pg_temp.tok('f2'))) AS after_final;
SELECT * FROM pg_temp.deltas();

-- With idempotency.log_transitions on, complete reads the key first: the
-- counts are the same (a completion, then a replay, then a stale token).
SET idempotency.log_transitions = on;
INSERT INTO t SELECT 'logged', token FROM idempotency.idem_claim('m-logged');
SELECT outcome FROM idempotency.idem_complete('m-logged', pg_temp.tok('logged'));
SELECT * FROM pg_temp.deltas();
SELECT outcome FROM idempotency.idem_complete('m-logged', pg_temp.tok('logged'));
SELECT pg_temp.try(format('SELECT idempotency.idem_complete(%L, %s)', 'm-logged', pg_temp.tok('logged') + 1)) AS stale;
RESET idempotency.log_transitions;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- inbox
SELECT idempotency.inbox_receive('msg-1', 'metrics') AS first_time;
SELECT * FROM pg_temp.deltas();
SELECT idempotency.inbox_receive('msg-1', 'metrics') AS again;
SELECT * FROM pg_temp.deltas();
-- A duplicate that the same transaction already received.
BEGIN;
SELECT idempotency.inbox_receive('msg-2', 'metrics') AS first_time,
       idempotency.inbox_receive('msg-2', 'metrics') AS again;
COMMIT;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- outbox
SELECT idempotency.outbox_enqueue('m.topic', '{"n": 1}', 'k') IS NOT NULL AS e1,
       idempotency.outbox_enqueue('m.topic', '{"n": 2}', dedup_key => 'd1') IS NOT NULL AS e2,
       idempotency.outbox_enqueue('m.other', '{"n": 3}') IS NOT NULL AS e3;
SELECT * FROM pg_temp.deltas();
SELECT idempotency.outbox_enqueue('m.topic', '{"n": 2}', dedup_key => 'd1') =
       (SELECT id FROM idempotency.outbox WHERE dedup_key = 'd1') AS deduplicated;
SELECT * FROM pg_temp.deltas();
-- Handing events out counts nothing; an ack counts each event it delivers.
CREATE TEMP TABLE got AS SELECT id, topic, payload FROM idempotency.outbox_claim('relay-1');
SELECT topic, payload FROM got ORDER BY id;
SELECT * FROM pg_temp.deltas();
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM got WHERE topic = 'm.topic')) AS acked;
SELECT * FROM pg_temp.deltas();
-- An ack of delivered events changes nothing and counts nothing.
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM got WHERE topic = 'm.topic')) AS acked;
SELECT * FROM pg_temp.deltas();
-- A retryable nack: retried. A final nack: dead.
SELECT idempotency.outbox_nack((SELECT id FROM got WHERE topic = 'm.other'), 'try again', retry_in => '0');
SELECT * FROM pg_temp.deltas();
DELETE FROM got;
INSERT INTO got SELECT id, topic, payload FROM idempotency.outbox_claim('relay-1');
SELECT topic, payload FROM got ORDER BY id;
SELECT idempotency.outbox_nack((SELECT id FROM got), 'no', retryable => false);
SELECT * FROM pg_temp.deltas();
-- A nack of an event not out for delivery changes nothing and counts nothing.
SELECT idempotency.outbox_nack((SELECT id FROM got), 'no');
SELECT * FROM pg_temp.deltas();
-- Attempts exhausted: a retryable nack buries the event.
SET idempotency.outbox_max_attempts = 1;
SELECT idempotency.outbox_enqueue('m.ex', '{"n": 4}') IS NOT NULL AS enqueued;
DELETE FROM got;
INSERT INTO got SELECT id, topic, payload FROM idempotency.outbox_claim('relay-1');
SELECT topic, payload FROM got ORDER BY id;
SELECT idempotency.outbox_nack((SELECT id FROM got), 'again');
RESET idempotency.outbox_max_attempts;
SELECT * FROM pg_temp.deltas();
-- In-flight leases that run out, swept by idem_maintenance(): back to
-- pending (retried) or, attempts exhausted, dead. A redrive counts nothing.
SELECT idempotency.outbox_enqueue('m.lease', '{"n": 5}') IS NOT NULL AS e5;
SELECT * FROM pg_temp.deltas();
SELECT idempotency.outbox_redrive() AS redriven;
SELECT * FROM pg_temp.deltas();
DELETE FROM got;
INSERT INTO got SELECT id, topic, payload FROM idempotency.outbox_claim('relay-1', 1, '50ms', ARRAY['m.lease']);
SELECT pg_sleep(0.1);
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.deltas();
-- The claim records its session's cap, which the sweep honours.
SET idempotency.outbox_max_attempts = 2;
INSERT INTO got SELECT id, topic, payload FROM idempotency.outbox_claim('relay-1', 1, '50ms', ARRAY['m.lease']);
RESET idempotency.outbox_max_attempts;
SELECT pg_sleep(0.1);
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
SELECT * FROM pg_temp.deltas();
SELECT payload, state, attempts, last_error FROM idempotency.outbox WHERE topic = 'm.lease' ORDER BY id;

-- ---------------------------------------------------------------- locks
INSERT INTO t SELECT 'l1', idempotency.idem_lock('m-res', '1h');
SELECT * FROM pg_temp.deltas();
-- A live holder: NULL, contended; a caller that waits counts one answer.
SELECT idempotency.idem_lock('m-res') IS NULL AS refused;
SELECT idempotency.idem_lock('m-res', wait => '100ms') IS NULL AS refused_after_wait;
SELECT * FROM pg_temp.deltas();
-- Renew, assert and unlock count nothing.
SELECT idempotency.idem_lock_renew('m-res', pg_temp.tok('l1')) AS renewed,
       pg_temp.try(format('SELECT idempotency.idem_lock_assert(%L, %s)', 'm-res', pg_temp.tok('l1'))) AS asserted,
       idempotency.idem_unlock('m-res', pg_temp.tok('l1')) AS unlocked;
SELECT * FROM pg_temp.deltas();
-- An expired lock is taken again: acquired.
SELECT idempotency.idem_lock('m-res2', '50ms') IS NOT NULL AS l2;
SELECT pg_sleep(0.1);
SELECT idempotency.idem_lock('m-res2') IS NOT NULL AS l2_again;
SELECT * FROM pg_temp.deltas();
-- A stale lock token: renew and unlock answer false and count nothing;
-- assert raises IK001 and counts a stale token.
SELECT idempotency.idem_lock_renew('m-res', pg_temp.tok('l1')) AS renewed,
       idempotency.idem_unlock('m-res', pg_temp.tok('l1')) AS unlocked,
       pg_temp.try(format('SELECT idempotency.idem_lock_assert(%L, %s)', 'm-res', pg_temp.tok('l1'))) AS asserted;
SELECT * FROM pg_temp.deltas();

-- ---------------------------------------------------------------- rollbacks
-- A rolled-back transaction: its state changes are not counted; its
-- answers (replay, in_progress, mismatch, inbox duplicate, contended lock)
-- are.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('m-rb-1');
SELECT outcome FROM idempotency.idem_complete('m-rb-1', (idempotency.idem_get('m-rb-1')).token);
SELECT outcome FROM idempotency.idem_claim('m-rb-2');
SELECT idempotency.idem_fail('m-rb-2', (idempotency.idem_get('m-rb-2')).token, 'e', retry_in => '0');
SELECT outcome FROM idempotency.idem_claim('m-rb-2');
SELECT idempotency.idem_fail('m-rb-2', (idempotency.idem_get('m-rb-2')).token, 'e', false);
SELECT outcome FROM idempotency.idem_claim('m-take');
SELECT outcome FROM idempotency.idem_claim('m-done');
SELECT outcome FROM idempotency.idem_claim('m-done', '{"a": 3}');
SELECT outcome FROM idempotency.idem_claim('m-busy');
SELECT idempotency.inbox_receive('msg-1', 'metrics') AS again;
SELECT idempotency.outbox_enqueue('m.rb', '{}') IS NOT NULL AS enqueued;
SELECT idempotency.outbox_enqueue('m.topic', '{"n": 2}', dedup_key => 'd1') IS NOT NULL AS deduplicated;
SELECT idempotency.idem_lock('m-rb-res') IS NOT NULL AS locked;
SELECT idempotency.idem_lock('m-rb-res') IS NULL AS refused;
ROLLBACK;
SELECT * FROM pg_temp.deltas();
-- Lease expirations roll back too (takeover and sweep).
INSERT INTO t SELECT 'rbx', token FROM idempotency.idem_claim('m-rbx', lease => '50ms');
INSERT INTO t SELECT 'rby', token FROM idempotency.idem_claim('m-rby', lease => '50ms');
SELECT pg_sleep(0.1);
SELECT * FROM pg_temp.deltas();
BEGIN;
SELECT outcome FROM idempotency.idem_claim('m-rbx');
SELECT * FROM idempotency.idem_maintenance() WHERE rows <> 0;
ROLLBACK;
SELECT * FROM pg_temp.deltas();
-- A stale token raised inside a transaction (which then rolls back): counted.
\set VERBOSITY sqlstate
BEGIN;
SELECT idempotency.idem_complete('m-stale', pg_temp.tok('s') + 1);
ROLLBACK;
\set VERBOSITY default
SELECT * FROM pg_temp.deltas();
-- ROLLBACK TO SAVEPOINT: the changes made after the savepoint are not
-- counted, those before it and after it are; the answers all are.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('m-sp-1');
SAVEPOINT a;
SELECT outcome FROM idempotency.idem_claim('m-sp-2');
SELECT outcome FROM idempotency.idem_complete('m-sp-1', (idempotency.idem_get('m-sp-1')).token);
SELECT idempotency.outbox_enqueue('m.sp', '{}') IS NOT NULL AS enqueued;
SELECT idempotency.idem_lock('m-sp-res') IS NOT NULL AS locked;
SELECT outcome FROM idempotency.idem_claim('m-done');
SELECT outcome FROM idempotency.idem_claim('m-sp-2');
ROLLBACK TO SAVEPOINT a;
SELECT idempotency.idem_fail('m-sp-1', (idempotency.idem_get('m-sp-1')).token, 'e', false);
COMMIT;
SELECT * FROM pg_temp.deltas();
-- Nested savepoints: an inner one rolled back, an outer one released.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idempotency.idem_claim('m-sp-3');
SAVEPOINT b;
SELECT outcome FROM idempotency.idem_claim('m-sp-4');
SAVEPOINT c;
SELECT outcome FROM idempotency.idem_claim('m-sp-5');
RELEASE SAVEPOINT c;
ROLLBACK TO SAVEPOINT b;
SELECT outcome FROM idempotency.idem_claim('m-sp-6');
RELEASE SAVEPOINT a;
SAVEPOINT d;
SELECT outcome FROM idempotency.idem_claim('m-sp-7');
ROLLBACK TO SAVEPOINT d;
COMMIT;
SELECT * FROM pg_temp.deltas();
SELECT key, status FROM idempotency.idempotency_keys WHERE key LIKE 'm-sp-%' ORDER BY key COLLATE "C";
-- A PL/pgSQL exception block is a subtransaction: its changes roll back
-- with it and are not counted.
DO $$
BEGIN
    BEGIN
        PERFORM idempotency.idem_claim('m-exc');
        PERFORM idempotency.outbox_enqueue('m.exc', '{}');
        RAISE EXCEPTION 'undo';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    PERFORM idempotency.idem_claim('m-exc-2');
END $$;
SELECT * FROM pg_temp.deltas();
SELECT idempotency.idem_get('m-exc') IS NULL AS rolled_back, (idempotency.idem_get('m-exc-2')).status;

-- ---------------------------------------------------------------- consistency since the reset
-- Every complete landed in exactly one bucket; the sum of the times lies
-- between what the buckets' bounds allow.
SELECT m.processing_count = (SELECT sum(b) FROM unnest(m.processing_ms_buckets) b) AS buckets_sum_to_count,
       m.processing_count - (s.m ->> 'processing_count')::bigint AS processing_count_delta,
       m.processing_ms_sum >= (SELECT sum(b * lo) FROM unnest(m.processing_ms_buckets, ARRAY[0, 1, 5, 10, 50, 100, 500, 1000, 5000, 10000]) u(b, lo))
         AND m.processing_ms_sum <= (SELECT sum(b * hi) FROM unnest(m.processing_ms_buckets, ARRAY[1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 0]) u(b, hi)) AS ms_sum_within_bounds
  FROM idempotency.idem_metrics m, saved s WHERE s.label = 'start';

-- ---------------------------------------------------------------- privileges
CREATE ROLE regress_idem_metrics_plain;
CREATE ROLE regress_idem_metrics_monitor;
SELECT idempotency.grant_application('regress_idem_metrics_plain');
GRANT pg_monitor TO regress_idem_metrics_monitor;
SELECT r.role,
       has_table_privilege(r.role, 'idempotency.idem_metrics', 'SELECT') AS may_read,
       has_function_privilege(r.role, 'idempotency.idem_metrics_reset()', 'EXECUTE') AS may_reset
  FROM (VALUES ('public'), ('regress_idem_metrics_plain'), ('regress_idem_metrics_monitor')) r(role);
SELECT coalesce((SELECT bool_or(a.grantee = 0) FROM aclexplode(p.proacl) a), true) AS public_may_reset
  FROM pg_proc p WHERE p.oid = 'idempotency.idem_metrics_reset()'::regprocedure;
SET ROLE regress_idem_metrics_plain;
SELECT pg_temp.try('SELECT * FROM idempotency.idem_metrics') AS read,
       pg_temp.try('SELECT * FROM idempotency.idem_metrics_row()') AS read_function,
       pg_temp.try('SELECT idempotency.idem_metrics_reset()') AS reset;
SET ROLE regress_idem_metrics_monitor;
SELECT count(*) AS rows FROM idempotency.idem_metrics;
SELECT pg_temp.try('SELECT idempotency.idem_metrics_reset()') AS reset;
RESET ROLE;
-- Nothing above reset the counters.
SELECT stats_reset = (SELECT (m ->> 'stats_reset')::timestamptz FROM saved WHERE label = 'start') AS not_reset
  FROM idempotency.idem_metrics;
SELECT * FROM pg_temp.deltas();
DROP OWNED BY regress_idem_metrics_plain;
DROP ROLE regress_idem_metrics_plain;
DROP ROLE regress_idem_metrics_monitor;

\c contrib_regression
DROP DATABASE idem_metrics;
