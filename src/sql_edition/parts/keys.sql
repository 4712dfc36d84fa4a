-- ---------------------------------------------------------------- key functions
--
-- The rules are the C++ edition's (src/core/claim_decision.cpp,
-- src/core/fence.cpp, src/core/retry.cpp), the rows the same, written by
-- plain statements. Every function a role is granted runs as the edition's
-- owner (SECURITY DEFINER) with a fixed search path; the helpers it calls
-- run under that path and set none of their own (a SET would cost a
-- configuration change per call and keep the simple ones from being
-- inlined); no function is PUBLIC's.
--
-- A claim never waits for another transaction unless it was given `wait`:
-- the creation of a new key is announced by a transaction-level advisory
-- lock on the key (class 1229212465, 'IDK1'), which a duplicate tries
-- without waiting; an existing key is locked FOR NO KEY UPDATE SKIP LOCKED,
-- and a key that is there but locked is being changed by a transaction
-- that has not ended. Either way the answer is in_progress at once.

-- The advisory lock that a transaction creating key (scope, key) holds.
CREATE FUNCTION idempotency.try_key_creation(scope pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE
AS $$ SELECT pg_try_advisory_xact_lock(1229212465, hashtext(scope || E'\x1f' || key)) $$;

-- What a key function answers about a stored key as it is.
CREATE FUNCTION idempotency.describe_key(k idempotency.idempotency_keys, outcome pg_catalog.text,
                                         retry_after pg_catalog.interval)
RETURNS idempotency.idem_outcome
LANGUAGE sql IMMUTABLE
AS $$
SELECT ROW(outcome, k.status, NULL::int8, k.attempts,
           CASE WHEN outcome = 'completed' THEN k.result END,
           CASE WHEN outcome = 'failed' THEN k.last_error END,
           retry_after, k.job_ref, false, NULL::jsonb)::idempotency.idem_outcome
$$;

-- Another transaction that has not ended is creating or changing the key:
-- in_progress, with the key's committed state when there is one.
CREATE FUNCTION idempotency.busy_key(k idempotency.idempotency_keys)
RETURNS idempotency.idem_outcome
LANGUAGE sql IMMUTABLE
AS $$
SELECT ROW('in_progress', k.status, NULL::int8, COALESCE(k.attempts, 0), NULL::jsonb, NULL::text,
           NULL::interval, k.job_ref, false, NULL::jsonb)::idempotency.idem_outcome
$$;

-- The claim's decision on a stored key (src/core/claim_decision.cpp):
-- 'mismatch', 'in_progress', 'completed', 'retry_later', 'failed' (answers),
-- 'grant', 'takeover' or 'expire' (changes).
CREATE FUNCTION idempotency.decide_claim(k idempotency.idempotency_keys, conflict pg_catalog.bool,
                                         now pg_catalog.timestamptz, OUT decision pg_catalog.text,
                                         OUT retry_after pg_catalog.interval)
LANGUAGE sql STABLE
AS $$
SELECT CASE
         WHEN conflict THEN 'mismatch'
         WHEN k.status = 'RECEIVED' THEN 'grant'
         WHEN k.status = 'PROCESSING' AND k.lease_until > now THEN 'in_progress'
         WHEN k.status = 'PROCESSING'
              AND k.attempts >= COALESCE(k.max_attempts, idempotency.setting_int('max_attempts', 5))
           THEN 'expire'
         WHEN k.status = 'PROCESSING' THEN 'takeover'
         WHEN k.status = 'COMPLETED' THEN 'completed'
         WHEN k.status = 'FAILED_RETRYABLE' AND k.next_attempt_at > now THEN 'retry_later'
         WHEN k.status = 'FAILED_RETRYABLE' THEN 'grant'
         ELSE 'failed' END,
       CASE
         WHEN conflict THEN NULL
         WHEN k.status = 'PROCESSING' AND k.lease_until > now THEN k.lease_until - now
         WHEN k.status = 'FAILED_RETRYABLE' AND k.next_attempt_at > now THEN k.next_attempt_at - now
       END
$$;

-- Waits, until `deadline` at the most, for the transaction that holds the
-- key: the one creating it (its advisory lock) or changing it (its row
-- lock). A lock wait, so it ends with that transaction; the lock is given
-- back at once (its subtransaction is rolled back), so that a claim that
-- then only answers holds nothing. False when the deadline came first.
CREATE FUNCTION idempotency.wait_for_key(p_scope pg_catalog.text, p_key pg_catalog.text,
                                         deadline pg_catalog.timestamptz)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    left_ms int8 := ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000);
BEGIN
    IF left_ms <= 0 THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', left_ms || 'ms', true);
        PERFORM pg_advisory_xact_lock(1229212465, hashtext(p_scope || E'\x1f' || p_key));
        PERFORM FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key FOR SHARE;
        RAISE SQLSTATE 'IKW00';
    EXCEPTION
        WHEN SQLSTATE 'IKW00' THEN
            RETURN true;
        WHEN lock_not_available THEN
            RETURN false;
    END;
END
$$;

-- Raises 40001 for a key that a transaction committed after this one's
-- snapshot changed (how, such as 'another transaction changed it').
CREATE FUNCTION idempotency.raise_changed_since_snapshot(p_scope pg_catalog.text, p_key pg_catalog.text,
                                                         how pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'could not serialize access to key "%" in scope "%": % after this transaction''s snapshot; retry the transaction, or claim under READ COMMITTED',
        p_key, p_scope, how USING ERRCODE = 'serialization_failure';
END
$$;

-- Raises a failed insert's 40001 again, naming the key, where the insert
-- met a key that a transaction committed after this transaction's snapshot
-- (under REPEATABLE READ or SERIALIZABLE; its error has no detail): a
-- conflict of SERIALIZABLE's own (which has one) is left as it is.
CREATE FUNCTION idempotency.raise_if_created_since_snapshot(p_scope pg_catalog.text, p_key pg_catalog.text,
                                                            detail pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF detail = '' THEN
        PERFORM idempotency.raise_changed_since_snapshot(p_scope, p_key, 'another transaction changed it');
    END IF;
END
$$;

-- Under REPEATABLE READ or SERIALIZABLE: raises 40001 when a transaction
-- that committed after this transaction's snapshot changed or removed the
-- key, which the snapshot cannot see, so that reading it again answers
-- nothing new. A locking read of the version the snapshot sees fails so
-- then; a row another transaction is changing now is not waited for, and
-- the subtransaction is rolled back, so that no lock stays.
CREATE FUNCTION idempotency.refuse_if_key_changed(p_scope pg_catalog.text, p_key pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM FROM idempotency.idempotency_keys i
         WHERE i.scope = p_scope AND i.key = p_key FOR SHARE NOWAIT;
        RAISE SQLSTATE 'IKW00';
    EXCEPTION
        WHEN SQLSTATE 'IKW00' OR lock_not_available THEN
            RETURN;
        WHEN serialization_failure THEN
            PERFORM idempotency.raise_changed_since_snapshot(p_scope, p_key, 'another transaction changed it');
    END;
END
$$;

-- The next token of token_seq, greater than the key's last: a sequence set
-- back below the key's tokens (the keys' table restored without it) is
-- moved past them first, so that a key's tokens always grow.
CREATE FUNCTION idempotency.token_above(last pg_catalog.int8)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    token int8 := nextval('idempotency.token_seq');
BEGIN
    IF token <= last THEN
        PERFORM setval('idempotency.token_seq', last);
        token := nextval('idempotency.token_seq');
    END IF;
    RETURN token;
END
$$;

-- A claim's new key, inserted: its token, and its scope and key as written
-- (a BEFORE trigger may change them); NULLs when a key is there.
CREATE FUNCTION idempotency.insert_claimed_key(p_scope pg_catalog.text, p_key pg_catalog.text,
                                               fp pg_catalog.bytea, lease pg_catalog.interval,
                                               OUT new_token pg_catalog.int8, OUT got_scope pg_catalog.text,
                                               OUT got_key pg_catalog.text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO idempotency.idempotency_keys AS i
           (scope, key, status, token, attempts, lease_until, fingerprint, created_at, updated_at,
            claimed_at, registered, lease_expired, holder_pid, max_attempts, retention, active_since)
    VALUES (p_scope, p_key, 'PROCESSING', nextval('idempotency.token_seq'), 1, now + lease, fp, now, now,
            now, false, false, pg_backend_pid(), idempotency.setting_int('max_attempts', 5),
            idempotency.setting_interval('retention', interval '1 s', interval '1 day'), now)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING i.token, i.scope, i.key INTO new_token, got_scope, got_key;
END
$$;

-- One round of a claim: an answer, or NULL when the key was created or
-- deleted meanwhile (read it again).
CREATE FUNCTION idempotency.claim_round(p_scope pg_catalog.text, p_key pg_catalog.text,
                                        request pg_catalog.jsonb, fp pg_catalog.bytea,
                                        lease pg_catalog.interval, deadline pg_catalog.timestamptz)
RETURNS idempotency.idem_outcome
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    k idempotency.idempotency_keys;
    known idempotency.idempotency_keys;  -- the committed state, while another transaction changes it
    d record;
    now timestamptz;
    new_token int8;
    got_scope text;
    got_key text;
    answer idempotency.idem_outcome;
    detail text;
BEGIN
    SELECT * INTO k FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
    IF NOT FOUND THEN
        -- A key gone but for its tombstone is answered from it (anywhere,
        -- also in a read-only transaction) and never created again.
        answer := idempotency.tombstone_answer(p_scope, p_key, fp, request);
        IF answer.outcome IS NOT NULL THEN
            RETURN answer;
        END IF;
        PERFORM idempotency.refuse_read_only('idem_claim');
        IF NOT idempotency.try_key_creation(p_scope, p_key) THEN
            IF idempotency.wait_for_key(p_scope, p_key, deadline) THEN
                RETURN NULL;
            END IF;
            RETURN idempotency.busy_key(NULL);
        END IF;
        -- Under REPEATABLE READ or SERIALIZABLE, a key committed since the
        -- snapshot fails the insert: only there is it a subtransaction.
        IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
            SELECT * INTO new_token, got_scope, got_key FROM idempotency.insert_claimed_key(p_scope, p_key, fp, lease);
        ELSE
            BEGIN
                SELECT * INTO new_token, got_scope, got_key FROM idempotency.insert_claimed_key(p_scope, p_key, fp, lease);
            EXCEPTION WHEN serialization_failure THEN
                GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
                PERFORM idempotency.raise_if_created_since_snapshot(p_scope, p_key, detail);
                RAISE;
            END;
        END IF;
        PERFORM idempotency.check_new_key(p_scope, p_key, got_scope, got_key, new_token IS NOT NULL);
        IF new_token IS NULL THEN
            RETURN NULL;
        END IF;
        -- The purge may have moved the key into its tombstone after the
        -- look above and before the insert: the insert is taken back and
        -- the tombstone answers.
        answer := idempotency.tombstone_answer(p_scope, p_key, fp, request);
        IF answer.outcome IS NOT NULL THEN
            DELETE FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
            RETURN answer;
        END IF;
        PERFORM idempotency.refuse_if_tombstone_made(p_scope, p_key);
        RETURN ROW('claimed', 'PROCESSING', new_token, 1, NULL, NULL, NULL, NULL, false, NULL)::idempotency.idem_outcome;
    END IF;

    -- The clock is read after the row: a retry due now must not look due
    -- in the future.
    d := idempotency.decide_claim(k, idempotency.fingerprint_differs(k.fingerprint, fp, request),
                                  clock_timestamp());
    IF d.decision NOT IN ('grant', 'takeover', 'expire') THEN
        RETURN idempotency.describe_key(k, d.decision, d.retry_after);
    END IF;
    PERFORM idempotency.refuse_read_only('idem_claim');

    -- Lock the row and decide again on what is there now; a row another
    -- transaction holds is not waited for.
    known := k;
    SELECT * INTO k FROM idempotency.idempotency_keys i
     WHERE i.scope = p_scope AND i.key = p_key FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key) THEN
            IF idempotency.wait_for_key(p_scope, p_key, deadline) THEN
                RETURN NULL;
            END IF;
            RETURN idempotency.busy_key(known);
        END IF;
        RETURN NULL;
    END IF;
    now := clock_timestamp();
    d := idempotency.decide_claim(k, idempotency.fingerprint_differs(k.fingerprint, fp, request), now);
    IF d.decision IN ('grant', 'takeover') THEN
        UPDATE idempotency.idempotency_keys i
           SET status = 'PROCESSING', token = idempotency.token_above(i.token), attempts = i.attempts + 1,
               lease_until = now + lease,
               fingerprint = CASE WHEN i.fingerprint IS NULL THEN fp ELSE i.fingerprint END,
               claimed_at = now, updated_at = now, next_attempt_at = NULL, expires_at = NULL,
               lease_expired = false, holder_pid = pg_backend_pid(),
               last_error = CASE WHEN d.decision = 'takeover' THEN 'lease expired' ELSE i.last_error END,
               purge_at = NULL, active_since = COALESCE(i.active_since, now),
               max_attempts = idempotency.setting_int('max_attempts', 5),
               retention = idempotency.setting_interval('retention', interval '1 s', interval '1 day')
         WHERE i.scope = p_scope AND i.key = p_key
        RETURNING * INTO k;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'idempotency: a trigger on the keys table refused a claim'
                USING ERRCODE = 'internal_error';
        END IF;
        -- Multi-step work resumes after the steps an earlier attempt
        -- finished: the new holder gets them and skips them.
        RETURN ROW('claimed', 'PROCESSING', k.token, k.attempts, NULL, NULL, NULL, k.job_ref, false,
                   k.steps)::idempotency.idem_outcome;
    ELSIF d.decision = 'expire' THEN
        UPDATE idempotency.idempotency_keys i
           SET status = 'FAILED_FINAL', last_error = 'lease expired', lease_expired = true,
               next_attempt_at = now, updated_at = now,
               expires_at = now + COALESCE(i.retention,
                   idempotency.setting_interval('retention', interval '1 s', interval '1 day')),
               holder_pid = NULL,
               purge_at = now + COALESCE(i.retention,
                   idempotency.setting_interval('retention', interval '1 s', interval '1 day')),
               active_since = NULL, lease_until = NULL
         WHERE i.scope = p_scope AND i.key = p_key
        RETURNING * INTO k;
        RETURN ROW('failed', 'FAILED_FINAL', NULL, k.attempts, NULL, 'lease expired', NULL, k.job_ref, false,
                   NULL)::idempotency.idem_outcome;
    END IF;
    RETURN idempotency.describe_key(k, d.decision, d.retry_after);
END
$$;

CREATE FUNCTION idempotency.idem_claim(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    lease pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    wait pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    fp bytea;
    deadline timestamptz;
    answer idempotency.idem_outcome;
    pause float8 := 0.001;  -- the first poll of a waiting claim; doubles up to 50 ms
    left_s float8;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF request IS NOT NULL THEN
        PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(request), 'request');
        fp := idempotency.fingerprint(request);
    END IF;
    lease := idempotency.lease_arg(lease, 'lease');
    wait := idempotency.wait_arg(wait);
    deadline := clock_timestamp() + COALESCE(wait, interval '0');
    FOR round IN 1 .. 1000000 LOOP
        IF round > 1 THEN
            -- Under a transaction snapshot, a change that ended a wait or
            -- a race is never seen: it fails the claim at once.
            PERFORM idempotency.refuse_if_key_changed(p_scope, p_key);
        END IF;
        answer := idempotency.claim_round(p_scope, p_key, request, fp, lease, deadline);
        IF answer IS NULL THEN
            IF round % 100 = 0 AND clock_timestamp() >= deadline THEN
                RAISE EXCEPTION 'could not settle the key against concurrent changes; retry the call'
                    USING ERRCODE = 'serialization_failure';
            END IF;
            CONTINUE;
        END IF;
        EXIT WHEN answer.outcome <> 'in_progress' OR clock_timestamp() >= deadline;
        -- Waiting duplicates poll with backoff (the C++ edition is woken
        -- by the holder's commit): never past the wait, nor much past the
        -- lease's end.
        left_s := extract(epoch FROM deadline - clock_timestamp());
        IF answer.retry_after IS NOT NULL THEN
            left_s := least(left_s, extract(epoch FROM answer.retry_after) + 0.001);
        END IF;
        PERFORM pg_sleep(greatest(least(pause, left_s), 0));
        pause := least(pause * 2, 0.05);
    END LOOP;
    RETURN answer;
END
$$;

-- A registered new key, inserted: true, and its scope and key as written
-- (a BEFORE trigger may change them); NULLs when a key is there.
CREATE FUNCTION idempotency.insert_registered_key(p_scope pg_catalog.text, p_key pg_catalog.text,
                                                  fp pg_catalog.bytea, p_job_ref pg_catalog.text,
                                                  now pg_catalog.timestamptz, OUT created pg_catalog.bool,
                                                  OUT got_scope pg_catalog.text, OUT got_key pg_catalog.text)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO idempotency.idempotency_keys AS i
           (scope, key, status, attempts, fingerprint, job_ref, created_at, updated_at, registered,
            lease_expired, active_since)
    VALUES (p_scope, p_key, 'RECEIVED', 0, fp, p_job_ref, now, now, true, false, now)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true, i.scope, i.key INTO created, got_scope, got_key;
END
$$;

CREATE FUNCTION idempotency.idem_register(
    key pg_catalog.text,
    request pg_catalog.jsonb DEFAULT NULL,
    job_ref pg_catalog.text DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idem_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    p_key text := key;
    p_scope text := scope;
    p_job_ref text := job_ref;
    fp bytea;
    k idempotency.idempotency_keys;
    now timestamptz;
    created bool;
    got_scope text;
    got_key text;
    answer idempotency.idem_outcome;
    detail text;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF request IS NOT NULL THEN
        PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(request), 'request');
        fp := idempotency.fingerprint(request);
    END IF;
    PERFORM idempotency.check_optional_name(p_job_ref, 'job_ref');
    FOR round IN 1 .. 100 LOOP
        now := clock_timestamp();
        SELECT * INTO k FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
        IF FOUND THEN
            IF idempotency.fingerprint_differs(k.fingerprint, fp, request) THEN
                RETURN idempotency.describe_key(k, 'mismatch', NULL);
            END IF;
            RETURN idempotency.describe_key(k,
                CASE k.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED_FINAL' THEN 'failed'
                              ELSE 'in_progress' END,
                CASE k.status WHEN 'RECEIVED' THEN interval '0'
                              WHEN 'PROCESSING' THEN greatest(k.lease_until - now, interval '0')
                              WHEN 'FAILED_RETRYABLE' THEN greatest(k.next_attempt_at - now, interval '0')
                END);
        END IF;
        answer := idempotency.tombstone_answer(p_scope, p_key, fp, request);
        IF answer.outcome IS NOT NULL THEN
            RETURN answer;
        END IF;
        PERFORM idempotency.refuse_read_only('idem_register');
        -- Another request with the key has not committed yet: in progress,
        -- answered at once (register never waits).
        IF NOT idempotency.try_key_creation(p_scope, p_key) THEN
            RETURN idempotency.busy_key(NULL);
        END IF;
        -- As for a claim: a key committed since a snapshot fails the insert.
        IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
            SELECT * INTO created, got_scope, got_key FROM idempotency.insert_registered_key(p_scope, p_key, fp, p_job_ref, now);
        ELSE
            BEGIN
                SELECT * INTO created, got_scope, got_key FROM idempotency.insert_registered_key(p_scope, p_key, fp, p_job_ref, now);
            EXCEPTION WHEN serialization_failure THEN
                GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
                PERFORM idempotency.raise_if_created_since_snapshot(p_scope, p_key, detail);
                RAISE;
            END;
        END IF;
        PERFORM idempotency.check_new_key(p_scope, p_key, got_scope, got_key, created IS NOT NULL);
        IF created THEN
            -- As for a claim: a purge that committed since the look above.
            answer := idempotency.tombstone_answer(p_scope, p_key, fp, request);
            IF answer.outcome IS NOT NULL THEN
                DELETE FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
                RETURN answer;
            END IF;
            PERFORM idempotency.refuse_if_tombstone_made(p_scope, p_key);
            RETURN ROW('registered', 'RECEIVED', NULL, 0, NULL, NULL, NULL, p_job_ref, false,
                       NULL)::idempotency.idem_outcome;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not settle the key against concurrent changes; retry the call'
        USING ERRCODE = 'serialization_failure';
END
$$;

CREATE FUNCTION idempotency.idem_get(
    key pg_catalog.text,
    scope pg_catalog.text DEFAULT 'default')
RETURNS idempotency.idempotency_keys
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    k idempotency.idempotency_keys;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    SELECT * INTO k FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
    IF FOUND THEN
        RETURN k;
    END IF;
    -- A key of which only the tombstone is left: its scope, key and final
    -- status, expires_at when the tombstone is forgotten, result_expired
    -- true; every other column NULL (the tombstone keeps none of them).
    SELECT s.status, s.forget_at INTO k.status, k.expires_at
      FROM idempotency.key_tombstones s WHERE s.key_digest = idempotency.tombstone_digest(p_scope, p_key);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    k.scope := p_scope;
    k.key := p_key;
    k.result_expired := true;
    RETURN k;
END
$$;

-- What a new key's INSERT gave back, checked as the C++ extension checks
-- it: a user's BEFORE INSERT trigger that gave the row another scope or
-- key is refused (27000: the call would answer for a key it did not
-- insert); one that skipped the row, or moved it onto a key that exists,
-- leaves no row for the key although this call holds its creation:
-- refused as well.
CREATE FUNCTION idempotency.check_new_key(p_scope pg_catalog.text, p_key pg_catalog.text,
                                          got_scope pg_catalog.text, got_key pg_catalog.text,
                                          inserted pg_catalog.bool)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF inserted AND (got_scope IS DISTINCT FROM p_scope OR got_key IS DISTINCT FROM p_key) THEN
        RAISE EXCEPTION 'a trigger on table "idempotency_keys" changed the scope or key of a new key'
            USING ERRCODE = 'triggered_data_change_violation',
                  DETAIL = format('The call is for key "%s" of scope "%s".', p_key, p_scope),
                  HINT = 'A BEFORE INSERT trigger on the keys table must leave scope and key as they are.';
    ELSIF NOT inserted
          AND NOT EXISTS (SELECT FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key) THEN
        RAISE EXCEPTION 'idempotency: a trigger on the keys table refused a new key'
            USING ERRCODE = 'internal_error';
    END IF;
END
$$;

-- A holder's change that a user's BEFORE trigger skipped (it returned
-- NULL): the call fails, as in the C++ extension, rather than answer as if
-- it had changed the key.
CREATE FUNCTION idempotency.refuse_skipped_change(call pg_catalog.text, p_token pg_catalog.int8)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: % of key with token % found no row to change', call, p_token
        USING ERRCODE = 'internal_error';
END
$$;

-- ---------------------------------------------------------------- the holder's calls

-- The key of a holder's call (complete, fail, heartbeat, release,
-- assert_owner, step), locked; its token checked by the fencing rules
-- (src/core/fence.cpp). Returns the row, with `verdict` 'proceed' or, for
-- complete only, 'completed' (a replay: a step after the complete is
-- refused); raises IK001, IK002, IK003.
CREATE FUNCTION idempotency.fence(call pg_catalog.text, p_scope pg_catalog.text, p_key pg_catalog.text,
                                  p_token pg_catalog.int8, OUT k idempotency.idempotency_keys,
                                  OUT verdict pg_catalog.text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    current bool;
BEGIN
    -- In a read-only transaction only a row there is to lock makes the
    -- lock fail (25006), as in the C++ extension: an absent key is IK002.
    IF current_setting('transaction_read_only')::bool THEN
        PERFORM FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
    END IF;
    IF FOUND OR NOT current_setting('transaction_read_only')::bool THEN
        SELECT * INTO k FROM idempotency.idempotency_keys i
         WHERE i.scope = p_scope AND i.key = p_key FOR NO KEY UPDATE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key "%" does not exist in scope "%"', p_key, p_scope
            USING ERRCODE = 'IK002';
    END IF;
    current := k.token IS NOT DISTINCT FROM p_token;
    IF call = 'assert_owner' THEN
        IF current AND k.status = 'PROCESSING' THEN
            verdict := 'proceed';
            RETURN;
        END IF;
        RAISE EXCEPTION 'token % does not own key "%" in scope "%" (the key is %)', p_token, p_key, p_scope,
                        k.status || CASE WHEN k.status = 'PROCESSING' THEN ' under another token' ELSE '' END
            USING ERRCODE = 'IK001';
    END IF;
    IF NOT current THEN
        RAISE EXCEPTION 'stale token % for key "%" in scope "%": the key was claimed again, released, or never had this token',
                        p_token, p_key, p_scope
            USING ERRCODE = 'IK001';
    END IF;
    IF k.status = 'PROCESSING' THEN
        verdict := 'proceed';
    ELSIF call IN ('complete', 'step') AND k.lease_expired AND k.status IN ('FAILED_RETRYABLE', 'FAILED_FINAL') THEN
        -- A holder whose lease expired keeps its token until the key is
        -- claimed again: its late complete still records the work it did,
        -- and its steps the steps it finished (the next holder skips them).
        verdict := 'proceed';
    ELSIF call = 'complete' AND k.status = 'COMPLETED' THEN
        verdict := 'completed';
    ELSE
        RAISE EXCEPTION 'key "%" in scope "%" is %: % is not allowed', p_key, p_scope, k.status, call
            USING ERRCODE = 'IK003';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_complete(
    key pg_catalog.text,
    token pg_catalog.int8,
    result pg_catalog.jsonb DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    retain pg_catalog.interval DEFAULT NULL,
    retain_key pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    p_result jsonb := result;
    f record;
    k idempotency.idempotency_keys;
    now timestamptz;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    IF p_result IS NOT NULL THEN
        PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(p_result), 'result');
    END IF;
    retain := COALESCE(idempotency.span_arg(retain, 'retain'),
                       idempotency.setting_interval('retention', interval '1 s', interval '1 day'));
    retain_key := idempotency.span_arg(retain_key, 'retain_key');
    f := idempotency.fence('complete', p_scope, p_key, token);
    k := f.k;
    IF f.verdict = 'proceed' THEN
        now := clock_timestamp();
        -- The key is left for the sweep to settle (idem_maintenance), unless
        -- the retention ends before the lease would: the key is filed at
        -- once, and settled in the same write (which names the columns it
        -- settles only then, as the C++ edition's does).
        IF k.lease_until IS NULL OR now + retain < k.lease_until THEN
            UPDATE idempotency.idempotency_keys i
               SET status = 'COMPLETED', result = p_result, completed_at = now, updated_at = now,
                   expires_at = now + retain, next_attempt_at = NULL, lease_expired = false, holder_pid = NULL,
                   key_retention = idem_complete.retain_key,
                   purge_at = now + retain, active_since = NULL, lease_until = NULL
             WHERE i.scope = p_scope AND i.key = p_key
            RETURNING * INTO k;
        ELSE
            UPDATE idempotency.idempotency_keys i
               SET status = 'COMPLETED', result = p_result, completed_at = now, updated_at = now,
                   expires_at = now + retain, next_attempt_at = NULL, lease_expired = false, holder_pid = NULL,
                   key_retention = idem_complete.retain_key, purge_at = i.purge_at
             WHERE i.scope = p_scope AND i.key = p_key
            RETURNING * INTO k;
        END IF;
        IF NOT FOUND THEN
            PERFORM idempotency.refuse_skipped_change('complete', token);
        END IF;
    END IF;
    RETURN ROW('completed', 'COMPLETED', token, k.attempts, k.result, NULL, NULL, k.job_ref, false,
               NULL)::idempotency.idem_outcome;
END
$$;

CREATE FUNCTION idempotency.idem_fail(
    key pg_catalog.text,
    token pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default',
    retain pg_catalog.interval DEFAULT NULL,
    retain_key pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.idem_status
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    p_error text := error;
    k idempotency.idempotency_keys;
    next_status idempotency.idem_status;
    now timestamptz;
    delay interval;
    kept interval;
    kept_key interval;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    IF p_error IS NULL THEN
        PERFORM idempotency.raise_null('error');
    END IF;
    PERFORM idempotency.check_value_size(octet_length(p_error), 'error');
    IF retryable IS NULL THEN
        PERFORM idempotency.raise_null('retryable');
    END IF;
    retry_in := idempotency.span_arg(retry_in, 'retry_in');
    retain := idempotency.span_arg(retain, 'retain');
    retain_key := idempotency.span_arg(retain_key, 'retain_key');
    k := (idempotency.fence('fail', p_scope, p_key, token)).k;
    -- The attempt cap and retention its claim recorded, else this session's;
    -- retain and retain_key only for a final failure (a retryable one is
    -- not finished).
    IF NOT retryable OR k.attempts >= COALESCE(k.max_attempts, idempotency.setting_int('max_attempts', 5)) THEN
        next_status := 'FAILED_FINAL';
        kept := COALESCE(retain, k.retention,
                         idempotency.setting_interval('retention', interval '1 s', interval '1 day'));
        kept_key := retain_key;
    ELSE
        next_status := 'FAILED_RETRYABLE';
        delay := COALESCE(retry_in, idempotency.backoff(k.attempts));
    END IF;
    now := clock_timestamp();
    -- A final failure is filed for retention; either failure settles its
    -- key in the same write (left to the sweep, a retryable one's settling
    -- would hold the row as a retry's claim comes).
    UPDATE idempotency.idempotency_keys i
       SET status = next_status, last_error = p_error, updated_at = now, next_attempt_at = now + delay,
           expires_at = now + kept, lease_expired = false, holder_pid = NULL, purge_at = now + kept,
           key_retention = kept_key, active_since = NULL, lease_until = NULL
     WHERE i.scope = p_scope AND i.key = p_key;
    IF NOT FOUND THEN
        PERFORM idempotency.refuse_skipped_change('fail', token);
    END IF;
    RETURN next_status;
END
$$;

CREATE FUNCTION idempotency.idem_heartbeat(
    key pg_catalog.text,
    token pg_catalog.int8,
    extend pg_catalog.interval DEFAULT NULL,
    scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    lease_end timestamptz;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    extend := idempotency.lease_arg(extend, 'extend');
    PERFORM idempotency.fence('heartbeat', p_scope, p_key, token);
    lease_end := clock_timestamp() + extend;
    UPDATE idempotency.idempotency_keys i SET lease_until = lease_end
     WHERE i.scope = p_scope AND i.key = p_key;
    IF NOT FOUND THEN
        PERFORM idempotency.refuse_skipped_change('heartbeat', token);
    END IF;
    RETURN lease_end;
END
$$;

CREATE FUNCTION idempotency.idem_release(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_key text := key;
    p_scope text := scope;
    k idempotency.idempotency_keys;
    now timestamptz;
BEGIN
    PERFORM idempotency.check_name(p_key, 'key'), idempotency.check_name(p_scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    k := (idempotency.fence('release', p_scope, p_key, token)).k;
    -- A registered key goes back to RECEIVED, and so does one with finished
    -- steps (their effects have committed: the next claim resumes after
    -- them); any other key is removed.
    IF k.registered OR k.steps IS NOT NULL THEN
        now := clock_timestamp();
        UPDATE idempotency.idempotency_keys i
           SET status = 'RECEIVED', token = NULL, attempts = i.attempts - 1, lease_until = NULL,
               next_attempt_at = now, updated_at = now, claimed_at = NULL, expires_at = NULL,
               lease_expired = false, holder_pid = NULL, purge_at = NULL
         WHERE i.scope = p_scope AND i.key = p_key;
    ELSE
        DELETE FROM idempotency.idempotency_keys i WHERE i.scope = p_scope AND i.key = p_key;
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_assert_owner(
    key pg_catalog.text,
    token pg_catalog.int8,
    scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.check_name(key, 'key'), idempotency.check_name(scope, 'scope', 63);
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    PERFORM idempotency.fence('assert_owner', scope, key, token);
END
$$;
