-- ---------------------------------------------------------------- inbox

-- True the first time a message is seen; a concurrent duplicate in another
-- transaction waits for the first to end (the primary key's insert does).
CREATE FUNCTION idempotency.inbox_receive(
    message_id pg_catalog.text,
    source pg_catalog.text DEFAULT 'default',
    payload pg_catalog.jsonb DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    first_time bool;
BEGIN
    PERFORM idempotency.check_name(message_id, 'message_id'), idempotency.check_name(source, 'source');
    IF payload IS NOT NULL THEN
        PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(payload), 'payload');
    END IF;
    INSERT INTO idempotency.inbox AS i (source, message_id, payload, received_at)
    VALUES (inbox_receive.source, inbox_receive.message_id, inbox_receive.payload, clock_timestamp())
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING true INTO first_time;
    RETURN COALESCE(first_time, false);
END
$$;

-- ---------------------------------------------------------------- resource locks
--
-- A taker announces itself with a transaction-level advisory lock on the
-- resource (class 1229212466, 'IDK2'), tried without waiting: a caller
-- without `wait` never waits for another transaction taking the lock.

-- Under REPEATABLE READ or SERIALIZABLE: whether a transaction that
-- committed after this transaction's snapshot changed or removed the
-- lock's row (an unlock, a renewal, another taker), which the snapshot
-- cannot see. A locking read of the version it sees fails so then; one
-- another transaction is changing now is not waited for, and no lock stays.
CREATE FUNCTION idempotency.lock_changed_since_snapshot(p_resource pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM FROM idempotency.locks l WHERE l.resource = p_resource FOR SHARE NOWAIT;
        RAISE SQLSTATE 'IKW00';
    EXCEPTION
        WHEN SQLSTATE 'IKW00' OR lock_not_available THEN
            RETURN false;
        WHEN serialization_failure THEN
            RETURN true;
    END;
END
$$;

-- The take of a free or expired lock under REPEATABLE READ or SERIALIZABLE.
-- A lock taken or renewed by a transaction that committed after the
-- snapshot fails the upsert with 40001: held, as the newest data would say
-- (one unlocked or purged since is taken). The upsert locks the row even
-- when its WHERE refuses; the subtransaction, rolled back then, gives that
-- lock back.
CREATE FUNCTION idempotency.take_lock_in_snapshot(p_resource pg_catalog.text,
                                                  p_owner pg_catalog.text,
                                                  now pg_catalog.timestamptz,
                                                  ttl pg_catalog.interval)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    token int8;
BEGIN
    INSERT INTO idempotency.locks AS l (resource, token, owner, acquired_at, expires_at)
    VALUES (p_resource, nextval('idempotency.token_seq'), p_owner, now, now + ttl)
    ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, owner = excluded.owner,
           acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
     WHERE l.expires_at <= now
    RETURNING l.token INTO token;
    IF token IS NULL THEN
        RAISE SQLSTATE 'IKW00';
    END IF;
    RETURN token;
EXCEPTION
    WHEN SQLSTATE 'IKW00' OR serialization_failure THEN
        RETURN NULL;
END
$$;

-- One try: a new token when the lock is free or expired, else NULL.
CREATE FUNCTION idempotency.try_lock(p_resource pg_catalog.text, p_owner pg_catalog.text,
                                     ttl pg_catalog.interval, deadline pg_catalog.timestamptz,
                                     OUT token pg_catalog.int8,
                                     OUT holder_until pg_catalog.timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    holder_until := now + interval '10 ms';  -- a concurrent taker: look again soon
    SELECT l.expires_at INTO holder_until FROM idempotency.locks l
     WHERE l.resource = p_resource AND l.expires_at > now;
    -- Under a transaction snapshot, a holder that unlocked since still
    -- looks alive: a lock changed since is looked at by trying to take it.
    IF FOUND AND NOT idempotency.lock_changed_since_snapshot(p_resource) THEN
        RETURN;
    END IF;
    holder_until := now + interval '10 ms';
    IF NOT pg_try_advisory_xact_lock(1229212466, hashtext(p_resource)) THEN
        -- Another transaction is taking the lock: a caller with a wait
        -- waits for it to end (a lock wait, given back at once).
        IF deadline > now THEN
            BEGIN
                PERFORM set_config('lock_timeout',
                                   ceil(extract(epoch FROM deadline - now) * 1000) || 'ms', true);
                PERFORM pg_advisory_xact_lock(1229212466, hashtext(p_resource));
                RAISE SQLSTATE 'IKW00';
            EXCEPTION
                WHEN SQLSTATE 'IKW00' THEN
                    holder_until := now;  -- look again at once
                WHEN lock_not_available THEN
                    NULL;
            END;
        END IF;
        RETURN;
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        token := idempotency.take_lock_in_snapshot(p_resource, p_owner, now, ttl);
        RETURN;
    END IF;
    -- An expired lock is taken by an update that only touches a row it
    -- takes (no lock is kept on a resource the caller did not get).
    UPDATE idempotency.locks l
       SET token = nextval('idempotency.token_seq'), owner = p_owner, acquired_at = now,
           expires_at = now + ttl
     WHERE l.resource = p_resource AND l.expires_at <= now
    RETURNING l.token INTO token;
    IF token IS NULL THEN
        INSERT INTO idempotency.locks AS l (resource, token, owner, acquired_at, expires_at)
        VALUES (p_resource, nextval('idempotency.token_seq'), p_owner, now, now + ttl)
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.token INTO token;
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_lock(
    resource pg_catalog.text,
    ttl pg_catalog.interval DEFAULT NULL,
    owner pg_catalog.text DEFAULT NULL,
    wait pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline timestamptz;
    got record;
    pause float8 := 0.001;
BEGIN
    PERFORM idempotency.check_name(resource, 'resource');
    ttl := idempotency.lease_arg(ttl, 'ttl');
    PERFORM idempotency.check_optional_name(owner, 'owner');
    wait := idempotency.wait_arg(wait);
    deadline := clock_timestamp() + COALESCE(wait, interval '0');
    LOOP
        got := idempotency.try_lock(resource, owner, ttl, deadline);
        EXIT WHEN got.token IS NOT NULL OR clock_timestamp() >= deadline;
        -- Polls with backoff until the holder's unlock, its expiry or the
        -- wait's end.
        PERFORM pg_sleep(greatest(least(pause,
            extract(epoch FROM least(deadline, got.holder_until + interval '1 ms') - clock_timestamp())), 0));
        pause := least(pause * 2, 0.05);
    END LOOP;
    RETURN got.token;
END
$$;

CREATE FUNCTION idempotency.idem_lock_renew(
    resource pg_catalog.text,
    token pg_catalog.int8,
    ttl pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now timestamptz;
BEGIN
    PERFORM idempotency.check_name(resource, 'resource');
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    ttl := idempotency.lease_arg(ttl, 'ttl');
    now := clock_timestamp();
    UPDATE idempotency.locks l SET expires_at = now + ttl
     WHERE l.resource = idem_lock_renew.resource AND l.token = idem_lock_renew.token AND l.expires_at > now;
    RETURN FOUND;
END
$$;

CREATE FUNCTION idempotency.idem_unlock(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.check_name(resource, 'resource');
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    DELETE FROM idempotency.locks l WHERE l.resource = idem_unlock.resource AND l.token = idem_unlock.token;
    RETURN FOUND;
END
$$;

CREATE FUNCTION idempotency.idem_lock_assert(
    resource pg_catalog.text,
    token pg_catalog.int8)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.check_name(resource, 'resource');
    IF token IS NULL THEN
        PERFORM idempotency.raise_null('token');
    END IF;
    PERFORM FROM idempotency.locks l
     WHERE l.resource = idem_lock_assert.resource AND l.token = idem_lock_assert.token
       AND l.expires_at > clock_timestamp()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'token % does not hold the lock on resource "%"', token, resource
            USING ERRCODE = 'IK001';
    END IF;
END
$$;
