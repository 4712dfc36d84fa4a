-- ---------------------------------------------------------------- multi-step work
--
-- The rules are the C++ edition's (src/core/steps.cpp): the holder records
-- each finished step in the transaction of the step's own writes, fenced by
-- its token as idem_complete is; the steps are the key's `steps` column,
-- which no index follows, so that recording one is a HOT update.
-- docs/keys.md#multi-step-work-resume-after-the-last-finished-step.

-- A step's name: 1 to 63 bytes of ASCII letters, digits and _ . : -
-- (22004, 22023, 22001).
CREATE FUNCTION idempotency.check_step_name(step pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    allowed_prefix text;
BEGIN
    IF step IS NULL THEN
        PERFORM idempotency.raise_null('step');
    ELSIF step = '' THEN
        RAISE EXCEPTION 'step must not be empty' USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(step) > 63 THEN
        RAISE EXCEPTION 'step must be at most 63 bytes long (it has %)', octet_length(step)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
    -- Every character before the first one refused is ASCII: one byte each.
    allowed_prefix := substring(step FROM '^[A-Za-z0-9_.:-]*');
    IF allowed_prefix <> step THEN
        RAISE EXCEPTION 'step must hold only ASCII letters, digits and _ . : - (byte % is not one of them)',
                        octet_length(allowed_prefix) + 1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_step(
    key pg_catalog.text,
    token pg_catalog.int8,
    step pg_catalog.text,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    p_step text := step;
    p_result jsonb := result;
    max_bytes int8;
    max_steps int4 := idempotency.setting_int('max_steps', 32);
    k idempotency.idempotency_keys;
    recorded int4;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    PERFORM idempotency.check_step_name(p_step);
    IF p_result IS NOT NULL THEN
        max_bytes := idempotency.setting_bytes('max_step_bytes', 16384);
        IF idempotency.jsonb_bytes(p_result) > max_bytes THEN
            RAISE EXCEPTION 'the result of step "%" must be at most % bytes (idempotency.max_step_bytes); it has %',
                            p_step, max_bytes, idempotency.jsonb_bytes(p_result)
                USING ERRCODE = 'string_data_right_truncation';
        END IF;
    END IF;
    -- The key is locked by the fence: the steps read are the newest, and no
    -- other step of this key is recorded before this one commits.
    k := (idempotency.fence('step', p_scope, p_key, token)).k;
    recorded := CASE WHEN k.steps IS NULL THEN 0
                     ELSE (SELECT count(*) FROM jsonb_object_keys(k.steps))::int4 END;
    -- A repeated name is reported first: it is the caller's logic, not a limit.
    IF k.steps ? p_step THEN
        RAISE EXCEPTION 'step "%" of key "%" in scope "%" is already recorded', p_step, p_key, p_scope
            USING ERRCODE = 'IK004';
    ELSIF recorded >= max_steps THEN
        RAISE EXCEPTION 'key "%" in scope "%" already holds % steps, as many as idempotency.max_steps allows',
                        p_key, p_scope, recorded
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    -- Only the steps change (not updated_at, not the lease).
    UPDATE idempotency.idempotency_keys i
       SET steps = COALESCE(i.steps, '{}'::jsonb)
                   || jsonb_build_object(p_step, jsonb_build_object(
                          'n', recorded + 1, 'attempt', i.attempts,
                          'result', COALESCE(p_result, 'null'::jsonb)))
     WHERE i.scope = p_scope AND i.key = p_key;
    IF NOT FOUND THEN
        PERFORM idempotency.refuse_skipped_change('step', token);
    END IF;
    RETURN recorded + 1;
END
$$;

-- One part of a step key's material: the number of the text's UTF-8 bytes
-- (digest_bytes), a colon and those bytes.
CREATE FUNCTION idempotency.step_key_part(value pg_catalog.text)
RETURNS pg_catalog.bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT convert_to(length(b) || ':', 'UTF8') || b FROM idempotency.digest_bytes(value) AS b $$;

-- The key to give a step's external call as the provider's idempotency
-- key: the step's name, a dash and the first 16 bytes (hex) of the SHA-256
-- of scope, key and step, each a step_key_part. It reads no table. Its text
-- is a contract with the providers that received it: it must never change,
-- and the C++ edition and the clients compute the same.
CREATE FUNCTION idempotency.idem_step_key(
    key pg_catalog.text,
    step pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.check_name(key, 'key'), idempotency.check_name(scope, 'scope', 63);
    PERFORM idempotency.check_step_name(step);
    RETURN step || '-' || encode(substr(sha256(
               idempotency.step_key_part(scope) || idempotency.step_key_part(key)
               || idempotency.step_key_part(step)), 1, 16), 'hex');
END
$$;
