-- Stress test schema: the extension, the side-effect table the workers write,
-- the logs the checks read, and the helpers pgbench calls. Every log row is
-- written in the same transaction as the call it records, so the logs hold
-- exactly what committed.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE EXTENSION idempotency;

-- The business side effect. No unique constraint: a duplicate would show.
CREATE TABLE effects (scope text, key text, token bigint, worker int, at timestamptz);

-- Every idem_claim answer (written by the claim statement itself).
CREATE TABLE claim_log (
    key text, outcome text, status text, token bigint, attempt int,
    lease_ms int, worker int, at timestamptz DEFAULT clock_timestamp());
-- Completions the extension accepted (same transaction as the effect).
CREATE TABLE complete_log (key text, token bigint, worker int, at timestamptz DEFAULT clock_timestamp());
-- Failures the extension accepted.
CREATE TABLE fail_log (key text, token bigint, status text, worker int, at timestamptz DEFAULT clock_timestamp());
-- Late workers fenced with IK001 (their effect rolled back with them).
CREATE TABLE fence_log (key text, call text, token bigint, worker int, at timestamptz DEFAULT clock_timestamp());
-- Duplicates replayed by a worker that had just completed the key.
CREATE TABLE replay_log (key text, token bigint, worker int, at timestamptz DEFAULT clock_timestamp());

CREATE FUNCTION stress_key(round bigint, kid int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT format('k%s-%s', round, kid) $$;

-- The worker's second transaction: the effect and the complete commit or roll
-- back together. Only IK001 (a later claim fenced this worker) is expected;
-- every other error escapes and aborts the pgbench client, failing the test.
CREATE FUNCTION stress_complete(round bigint, kid int, tok bigint, worker int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    k text := stress_key(round, kid);
    o idempotency.idem_outcome;
BEGIN
    BEGIN
        INSERT INTO effects VALUES ('stress', k, tok, worker, clock_timestamp());
        SELECT * INTO o FROM idempotency.idem_complete(
            k, tok, jsonb_build_object('token', tok, 'worker', worker), 'stress');
        IF o.outcome IS DISTINCT FROM 'completed' OR o.status IS DISTINCT FROM 'COMPLETED'
           OR o.token IS DISTINCT FROM tok THEN
            RAISE EXCEPTION 'complete of % with token % answered %', k, tok, o
                USING ERRCODE = 'ST001';
        END IF;
        INSERT INTO complete_log VALUES (k, tok, worker);
        RETURN 1;
    EXCEPTION WHEN SQLSTATE 'IK001' THEN
        INSERT INTO fence_log VALUES (k, 'complete', tok, worker);
        RETURN 0;
    END;
END $$;

-- A retryable failure, fenced like complete. A worker whose lease ran out
-- and was recorded as expired (by the sweep or a claim) before anyone
-- claimed again is refused with IK003: only a PROCESSING key can fail.
CREATE FUNCTION stress_fail(round bigint, kid int, tok bigint, worker int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    k text := stress_key(round, kid);
    s idempotency.idem_status;
BEGIN
    BEGIN
        s := idempotency.idem_fail(k, tok, 'stress: simulated failure', true, '20 ms', 'stress');
        INSERT INTO fail_log VALUES (k, tok, s, worker);
        RETURN 1;
    EXCEPTION WHEN SQLSTATE 'IK001' THEN
        INSERT INTO fence_log VALUES (k, 'fail', tok, worker);
        RETURN 0;
    WHEN SQLSTATE 'IK003' THEN
        IF (SELECT status = 'PROCESSING' OR NOT lease_expired
              FROM idempotency.idem_get(k, 'stress')) THEN
            RAISE;  -- refused although the key was its holder's to fail
        END IF;
        INSERT INTO fence_log VALUES (k, 'fail after expiry', tok, worker);
        RETURN 0;
    END;
END $$;

-- Right after its own complete committed, a worker sends the duplicate: the
-- claim must replay the stored result, and a repeated complete with the same
-- token must be a no-op answering the same outcome.
CREATE FUNCTION stress_replay(round bigint, kid int, tok bigint, worker int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k text := stress_key(round, kid);
    o idempotency.idem_outcome;
BEGIN
    SELECT * INTO o FROM idempotency.idem_claim(k, NULL, '50 ms', 'stress');
    IF o.outcome IS DISTINCT FROM 'completed' OR o.token IS NOT NULL
       OR (o.result->>'token')::bigint IS DISTINCT FROM tok THEN
        RAISE EXCEPTION 'duplicate claim of completed % (token %) answered %', k, tok, o
            USING ERRCODE = 'ST002';
    END IF;
    SELECT * INTO o FROM idempotency.idem_complete(k, tok, NULL, 'stress');
    IF o.outcome IS DISTINCT FROM 'completed' OR o.token IS DISTINCT FROM tok
       OR (o.result->>'token')::bigint IS DISTINCT FROM tok THEN
        RAISE EXCEPTION 'repeated complete of % (token %) answered %', k, tok, o
            USING ERRCODE = 'ST003';
    END IF;
    INSERT INTO replay_log VALUES (k, tok, worker);
END $$;
