-- Baselines for `make bench`: the semantics of idem_claim + idem_complete
-- written by hand, the way a competent engineer would without the extension.
--
--   (a) plain SQL: the statements a client sends itself (see the *_plain.sql
--       pgbench scripts): INSERT ... ON CONFLICT DO NOTHING RETURNING for a
--       new key; for an existing key a read of its state, and a guarded
--       UPDATE only when the key may be taken over; complete as one guarded
--       UPDATE ... RETURNING.
--   (b) PL/pgSQL: bench.plpgsql_claim and bench.plpgsql_complete below, one
--       call per operation, like the extension.
--
-- The physical floor (c) is what the storage itself costs, with no logic:
-- bench.floor_keys, a table with only a text primary key and a jsonb column
-- (scripts floor_*.sql: INSERT then UPDATE of one row; for a duplicate, a
-- bare SELECT by primary key of bench.idempotency_keys, the same row shape
-- as the extension's table).
--
-- Both (a) and (b) work on bench.idempotency_keys, which has the same columns, primary
-- key and fillfactor as idempotency.idempotency_keys. Fencing tokens come
-- from a sequence; a duplicate of completed work is answered by a read (no
-- row lock, no transaction id, no WAL); an expired lease is taken over with
-- a new token (or moved to FAILED_FINAL when its attempts are exhausted).
-- Request fingerprints are left out: the benchmark passes no request.

SET client_min_messages = warning;
DROP SCHEMA IF EXISTS bench CASCADE;
CREATE SCHEMA bench;

CREATE TYPE bench.idem_status AS ENUM
    ('RECEIVED', 'PROCESSING', 'COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL');

CREATE TYPE bench.idem_outcome AS (
    outcome     text,
    status      bench.idem_status,
    token       bigint,
    attempt     int,
    result      jsonb,
    error       text,
    retry_after interval,
    job_ref     text
);

CREATE SEQUENCE bench.token_seq AS bigint;

CREATE TABLE bench.idempotency_keys (
    scope           text NOT NULL,
    key             text NOT NULL,
    status          bench.idem_status NOT NULL,
    token           bigint,
    attempts        int NOT NULL DEFAULT 0,
    lease_until     timestamptz,
    next_attempt_at timestamptz,
    fingerprint     bytea,
    result          jsonb,
    last_error      text,
    job_ref         text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    expires_at      timestamptz,
    claimed_at      timestamptz,
    registered      bool NOT NULL DEFAULT false,
    lease_expired   bool NOT NULL DEFAULT false,
    holder_pid      int,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 70);

-- claim: new key -> claimed; COMPLETED -> completed + result (a read);
-- live lease -> in_progress; backoff pending -> retry_later; FAILED_FINAL ->
-- failed; RECEIVED, expired lease or backoff passed -> claimed with a new
-- token (expired lease with attempts exhausted -> FAILED_FINAL, failed).
CREATE FUNCTION bench.plpgsql_claim(
    p_key text,
    p_lease interval DEFAULT '30 seconds',
    p_scope text DEFAULT 'default',
    p_max_attempts int DEFAULT 5)
RETURNS bench.idem_outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k   bench.idempotency_keys;
    t_now timestamptz;
    o   bench.idem_outcome;
BEGIN
    IF p_key IS NULL OR p_scope IS NULL THEN
        RAISE EXCEPTION 'key and scope must not be NULL' USING ERRCODE = '22004';
    END IF;
    FOR round IN 1..100 LOOP
        t_now := clock_timestamp();
        -- Read first: a duplicate is answered by this read alone (no row
        -- lock, no transaction id, no sequence value spent).
        SELECT * INTO k FROM bench.idempotency_keys WHERE scope = p_scope AND key = p_key;
        IF NOT FOUND THEN
            INSERT INTO bench.idempotency_keys
                   (scope, key, status, token, attempts, lease_until, created_at, updated_at,
                    claimed_at, holder_pid)
            VALUES (p_scope, p_key, 'PROCESSING', nextval('bench.token_seq'), 1,
                    t_now + p_lease, t_now, t_now, t_now, pg_backend_pid())
            ON CONFLICT (scope, key) DO NOTHING
            RETURNING token INTO o.token;
            IF FOUND THEN
                o.outcome := 'claimed'; o.status := 'PROCESSING'; o.attempt := 1;
                RETURN o;
            END IF;
            CONTINUE;  -- created concurrently (that transaction has ended): read again
        END IF;

        o.status := k.status; o.attempt := k.attempts; o.job_ref := k.job_ref;
        IF k.status = 'COMPLETED' THEN
            o.outcome := 'completed'; o.result := k.result;
            RETURN o;
        ELSIF k.status = 'FAILED_FINAL' THEN
            o.outcome := 'failed'; o.error := k.last_error;
            RETURN o;
        ELSIF k.status = 'PROCESSING' AND k.lease_until > t_now THEN
            o.outcome := 'in_progress'; o.retry_after := k.lease_until - t_now;
            RETURN o;
        ELSIF k.status = 'FAILED_RETRYABLE' AND k.next_attempt_at > t_now THEN
            o.outcome := 'retry_later'; o.retry_after := k.next_attempt_at - t_now;
            RETURN o;
        ELSIF k.status = 'PROCESSING' AND k.attempts >= p_max_attempts THEN
            -- Expired lease, no attempts left: dead letter.
            UPDATE bench.idempotency_keys
               SET status = 'FAILED_FINAL', last_error = 'lease expired', lease_expired = true,
                   next_attempt_at = t_now, updated_at = t_now,
                   expires_at = t_now + interval '24 hours', holder_pid = NULL
             WHERE scope = p_scope AND key = p_key AND token IS NOT DISTINCT FROM k.token
               AND status = 'PROCESSING' AND lease_until <= t_now;
            IF FOUND THEN
                o.outcome := 'failed'; o.status := 'FAILED_FINAL'; o.error := 'lease expired';
                RETURN o;
            END IF;
            CONTINUE;  -- it changed under us: decide again
        END IF;

        -- Claimable: take it over; the WHERE clause re-checks under the row lock.
        UPDATE bench.idempotency_keys
           SET status = 'PROCESSING', token = nextval('bench.token_seq'),
               attempts = attempts + 1, lease_until = t_now + p_lease, claimed_at = t_now,
               updated_at = t_now, next_attempt_at = NULL, expires_at = NULL,
               lease_expired = false, holder_pid = pg_backend_pid()
         WHERE scope = p_scope AND key = p_key
           AND (status = 'RECEIVED'
                OR (status = 'PROCESSING' AND lease_until <= t_now AND attempts < p_max_attempts)
                OR (status = 'FAILED_RETRYABLE' AND next_attempt_at <= t_now))
        RETURNING token, attempts INTO o.token, o.attempt;
        IF FOUND THEN
            o.outcome := 'claimed'; o.status := 'PROCESSING'; o.result := NULL;
            RETURN o;
        END IF;
        -- Someone else changed it first: decide again on what is there now.
    END LOOP;
    RAISE EXCEPTION 'could not settle key % against concurrent changes', p_key
        USING ERRCODE = '40001';
END;
$$;

-- complete: PROCESSING (or lease expired under the holder, nobody claimed
-- since) with the current token -> COMPLETED. A repeated complete with the
-- same token returns the stored outcome; otherwise IK002 / IK001 / IK003.
CREATE FUNCTION bench.plpgsql_complete(
    p_key text,
    p_token bigint,
    p_result jsonb DEFAULT NULL,
    p_scope text DEFAULT 'default',
    p_retain interval DEFAULT '24 hours')
RETURNS bench.idem_outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k   bench.idempotency_keys;
    t_now timestamptz := clock_timestamp();
    o   bench.idem_outcome;
BEGIN
    IF p_key IS NULL OR p_scope IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'key, scope and token must not be NULL' USING ERRCODE = '22004';
    END IF;
    o.outcome := 'completed'; o.status := 'COMPLETED'; o.token := p_token;
    UPDATE bench.idempotency_keys
       SET status = 'COMPLETED', result = p_result, completed_at = t_now, updated_at = t_now,
           expires_at = t_now + p_retain, next_attempt_at = NULL, lease_expired = false,
           holder_pid = NULL
     WHERE scope = p_scope AND key = p_key AND token = p_token
       AND (status = 'PROCESSING'
            OR (lease_expired AND status IN ('FAILED_RETRYABLE', 'FAILED_FINAL')))
    RETURNING attempts, result, job_ref INTO o.attempt, o.result, o.job_ref;
    IF FOUND THEN
        RETURN o;
    END IF;

    -- Not completed now: a replay of an earlier complete, or a refusal.
    SELECT * INTO k FROM bench.idempotency_keys
     WHERE scope = p_scope AND key = p_key FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key "%" does not exist in scope "%"', p_key, p_scope
            USING ERRCODE = 'IK002';
    ELSIF k.token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'stale token % for key "%"', p_token, p_key USING ERRCODE = 'IK001';
    ELSIF k.status = 'COMPLETED' THEN
        o.attempt := k.attempts; o.result := k.result; o.job_ref := k.job_ref;
        RETURN o;
    END IF;
    RAISE EXCEPTION 'key "%" is %: complete is not allowed', p_key, k.status
        USING ERRCODE = 'IK003';
END;
$$;

-- The physical floor of a claim + complete: the cheapest table that holds
-- a key and its result.
CREATE TABLE bench.floor_keys (
    key    text PRIMARY KEY,
    result jsonb
);

-- Fills both tables with the same n COMPLETED keys '1' .. 'n' (scope
-- 'default'), the duplicates of scenario "duplicate", and the floor's table
-- with as many keys (so that its statements are planned as for a table in
-- use). The scripts' new keys are (client_id + 1) * 10^9 + counter, so they
-- never collide with these.
CREATE FUNCTION bench.preload(n int) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO idempotency.idempotency_keys
           (scope, key, status, token, attempts, result, created_at, updated_at, completed_at,
            expires_at, claimed_at)
    SELECT 'default', i::text, 'COMPLETED', nextval('idempotency.token_seq'), 1,
           jsonb_build_object('order', i, 'ok', true), now(), now(), now(),
           now() + interval '24 hours', now()
      FROM generate_series(1, n) AS i;
    INSERT INTO bench.idempotency_keys
           (scope, key, status, token, attempts, result, created_at, updated_at, completed_at,
            expires_at, claimed_at)
    SELECT 'default', i::text, 'COMPLETED', nextval('bench.token_seq'), 1,
           jsonb_build_object('order', i, 'ok', true), now(), now(), now(),
           now() + interval '24 hours', now()
      FROM generate_series(1, n) AS i;
    INSERT INTO bench.floor_keys
    SELECT i::text, jsonb_build_object('order', i, 'ok', true) FROM generate_series(1, n) AS i;
$$;

-- The size of a fresh copy of a table's rows: the same columns, indexes and
-- fillfactor, the rows written anew (what the table would take if it were
-- rewritten now), in bytes with its indexes. The reference of the churn
-- benchmark: the live rows' size.
CREATE FUNCTION bench.fresh_size(rel regclass) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    options text;
    bytes bigint;
BEGIN
    SELECT coalesce(string_agg(o, ', '), 'fillfactor = 100') INTO options
      FROM pg_class c, unnest(c.reloptions) AS o
     WHERE c.oid = rel AND o LIKE 'fillfactor=%';
    EXECUTE format('CREATE TEMP TABLE fresh_copy (LIKE %s INCLUDING ALL) WITH (%s)', rel, options);
    EXECUTE format('INSERT INTO fresh_copy OVERRIDING SYSTEM VALUE SELECT * FROM %s', rel);
    bytes := pg_total_relation_size('fresh_copy');
    DROP TABLE fresh_copy;
    RETURN bytes;
END $$;
