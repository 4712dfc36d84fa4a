-- The baseline of the steps benchmark (test/bench/steps.sh): multi-step
-- work written by hand in PL/pgSQL, on the hand-written keys of
-- baselines.sql (bench.idempotency_keys, bench.plpgsql_claim and
-- bench.plpgsql_complete), the way a competent engineer would without the
-- extension: a table of steps beside the keys, and a function that fences
-- a step by the key's token (the row locked, as an UPDATE would lock it)
-- and records it once, in the caller's transaction.

SET client_min_messages = warning;

CREATE TABLE bench.key_steps (
    scope   text NOT NULL,
    key     text NOT NULL,
    step    text NOT NULL,
    n       int NOT NULL,     -- the step's place in the key's order
    attempt int NOT NULL,     -- the claim that recorded it
    result  jsonb,
    PRIMARY KEY (scope, key, step)
);

-- A finished step of a PROCESSING key (or of a holder whose lease expired
-- while nobody claimed since), with the current token: recorded after the
-- key's other steps; its place is returned. IK002 / IK001 / IK003 as
-- plpgsql_complete, IK004 for a step already recorded.
CREATE FUNCTION bench.plpgsql_step(
    p_key text,
    p_token bigint,
    p_step text,
    p_result jsonb DEFAULT NULL,
    p_scope text DEFAULT 'default')
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k   bench.idempotency_keys;
    v_n int;
BEGIN
    IF p_key IS NULL OR p_scope IS NULL OR p_token IS NULL OR p_step IS NULL THEN
        RAISE EXCEPTION 'key, scope, token and step must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- The fence: the key's row locked until the transaction ends, so that a
    -- takeover or a complete waits for the step (or the step for them).
    SELECT * INTO k FROM bench.idempotency_keys
     WHERE scope = p_scope AND key = p_key FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key "%" does not exist in scope "%"', p_key, p_scope
            USING ERRCODE = 'IK002';
    ELSIF k.token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'stale token % for key "%"', p_token, p_key USING ERRCODE = 'IK001';
    ELSIF NOT (k.status = 'PROCESSING'
               OR (k.lease_expired AND k.status IN ('FAILED_RETRYABLE', 'FAILED_FINAL'))) THEN
        RAISE EXCEPTION 'key "%" is %: step is not allowed', p_key, k.status
            USING ERRCODE = 'IK003';
    END IF;
    SELECT count(*) + 1 INTO v_n FROM bench.key_steps WHERE scope = p_scope AND key = p_key;
    INSERT INTO bench.key_steps (scope, key, step, n, attempt, result)
    VALUES (p_scope, p_key, p_step, v_n, k.attempts, COALESCE(p_result, 'null'))
    ON CONFLICT (scope, key, step) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step "%" of key "%" is already recorded', p_step, p_key
            USING ERRCODE = 'IK004';
    END IF;
    RETURN v_n;
END;
$$;
