-- ---------------------------------------------------------------- outbox
--
-- The queue keeps the C++ edition's layout (docs/outbox.md, "Heads and
-- places"): the one event of each (topic, key) that a claim may hand out,
-- its head, has a ready_at; events waiting behind it have none. What
-- differs: a claim writes its events in flight at once (the C++ edition
-- holds them by row locks until its transaction commits), and the
-- producers of one key take the key's turn (a transaction-level advisory
-- lock, class 1229212467 'IDK3') from their enqueue to their commit, as
-- acks, redrives and discards of its events do, so they wait for one
-- another's open transactions instead of settling the order at commit.

CREATE FUNCTION idempotency.take_key_turn(p_topic pg_catalog.text, p_key pg_catalog.text)
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_advisory_xact_lock(1229212467, hashtext(p_topic || E'\x1f' || p_key)) $$;

-- Makes the first live event of (topic, key) its key's head when it has no
-- ready place: due when it is (pending), or when its lease ends (in flight).
-- A dead first event holds the key back. Runs under the key's turn.
CREATE FUNCTION idempotency.make_head(p_topic pg_catalog.text, p_key pg_catalog.text,
                                      now pg_catalog.timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    first record;
BEGIN
    SELECT o.id, o.state, o.ready_at INTO first
      FROM idempotency.outbox o
     WHERE hashtextextended(o.key, hashtextextended(o.topic, 0))
           = hashtextextended(p_key, hashtextextended(p_topic, 0))
       AND o.state IN ('pending', 'in_flight', 'dead') AND o.key IS NOT NULL
       AND o.topic = p_topic AND o.key = p_key
     ORDER BY hashtextextended(o.key, hashtextextended(o.topic, 0)), COALESCE(o.key_seq, o.id), o.id
     LIMIT 1;
    IF FOUND AND first.ready_at IS NULL AND first.state <> 'dead' THEN
        UPDATE idempotency.outbox o
           SET ready_at = CASE WHEN o.state = 'in_flight' THEN o.lease_until
                               ELSE greatest(o.available_at, now) END
         WHERE o.id = first.id;
    END IF;
END
$$;

CREATE FUNCTION idempotency.outbox_enqueue(
    topic pg_catalog.text,
    payload pg_catalog.jsonb,
    key pg_catalog.text DEFAULT NULL,
    headers pg_catalog.jsonb DEFAULT NULL,
    dedup_key pg_catalog.text DEFAULT NULL,
    deliver_at pg_catalog.timestamptz DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    p_topic text := topic;
    p_key text := key;
    p_dedup_key text := dedup_key;
    now timestamptz := clock_timestamp();
    new_id int8;
    head bool := true;
BEGIN
    PERFORM idempotency.check_name(p_topic, 'topic');
    IF payload IS NULL THEN
        PERFORM idempotency.raise_null('payload');
    END IF;
    PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(payload), 'payload');
    IF p_key IS NOT NULL THEN
        PERFORM idempotency.check_name(p_key, 'key');
    END IF;
    IF headers IS NOT NULL THEN
        PERFORM idempotency.check_value_size(idempotency.jsonb_bytes(headers), 'headers');
        IF jsonb_typeof(headers) <> 'object' THEN
            RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF p_dedup_key IS NOT NULL THEN
        PERFORM idempotency.check_name(p_dedup_key, 'dedup_key');
    END IF;
    IF deliver_at IN ('infinity', '-infinity') THEN
        RAISE EXCEPTION 'deliver_at must be a finite timestamp' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_key IS NOT NULL THEN
        -- The key's head is decided from what the statement sees: under a
        -- transaction snapshot that may miss the key's latest events (one
        -- acked, or enqueued by a producer that committed since), and the
        -- event would wait for ever or a key would get two heads.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'outbox_enqueue of an event with a key needs READ COMMITTED in the SQL edition (this transaction is %)',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Enqueue it in a READ COMMITTED transaction, or without a key; the C++ extension takes any level.';
        END IF;
        PERFORM idempotency.take_key_turn(p_topic, p_key);
        -- The first event of a key with no live one is its head at once: one
        -- write, no second version of the new row (as in the C++ extension).
        head := NOT EXISTS (
            SELECT FROM idempotency.outbox o
             WHERE hashtextextended(o.key, hashtextextended(o.topic, 0))
                   = hashtextextended(p_key, hashtextextended(p_topic, 0))
               AND o.state IN ('pending', 'in_flight', 'dead') AND o.key IS NOT NULL
               AND o.topic = p_topic AND o.key = p_key);
    END IF;
    INSERT INTO idempotency.outbox AS o (topic, key, payload, headers, dedup_key, enqueued_at, available_at,
                                         updated_at, ready_at)
    VALUES (p_topic, p_key, payload, headers, p_dedup_key, now, COALESCE(deliver_at, now), now,
            CASE WHEN head THEN greatest(COALESCE(deliver_at, now), now) END)
    ON CONFLICT (topic, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING o.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT o.id INTO new_id FROM idempotency.outbox o WHERE o.topic = p_topic AND o.dedup_key = p_dedup_key;
        RETURN new_id;
    END IF;
    IF NOT head THEN
        PERFORM idempotency.make_head(p_topic, p_key, now);
    END IF;
    -- Listeners hear of the event when this transaction commits.
    IF idempotency.setting_bool('outbox_notify', true) THEN
        PERFORM pg_notify('idempotency_outbox', p_topic);
    END IF;
    RETURN new_id;
END
$$;

-- ---------------------------------------------------------------- relay scope

-- The topics the calling role may act on: NULL for every topic (a
-- superuser, a member of the owner, a role without grants given the
-- functions by hand), else the union of its grants' topics.
CREATE FUNCTION idempotency.relay_topics(OUT every_topic pg_catalog.bool, OUT topics pg_catalog.text[])
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    caller oid := idempotency.calling_role();
    grants int8;
    any_every bool;
BEGIN
    every_topic := true;
    IF (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = caller)
       OR pg_has_role(caller, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'idempotency'), 'USAGE') THEN
        RETURN;
    END IF;
    SELECT bool_or(g.topics IS NULL), array_agg(t.topic) FILTER (WHERE t.topic IS NOT NULL), count(*)
      INTO any_every, topics, grants
      FROM idempotency.relay_grants g LEFT JOIN LATERAL unnest(g.topics) AS t (topic) ON true
     WHERE pg_has_role(caller, g.role::oid, 'USAGE');
    IF grants = 0 OR any_every THEN
        topics := NULL;
        RETURN;
    END IF;
    every_topic := false;
    topics := COALESCE(topics, '{}');
END
$$;

CREATE FUNCTION idempotency.refuse_topic(what pg_catalog.text, p_topic pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RAISE EXCEPTION 'role % may not % events of topic "%"',
                    (SELECT r.rolname FROM pg_roles r WHERE r.oid = idempotency.calling_role()), what, p_topic
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The extension''s owner gives a relay role its topics with '
                     'idempotency.grant_relay(role, topics).';
END
$$;

-- Raises 42501 when one of the events `ids` is of a topic the caller may not act on.
CREATE FUNCTION idempotency.check_event_topics(ids pg_catalog.int8[], what pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    scope record := idempotency.relay_topics();
    foreign_topic text;
BEGIN
    IF scope.every_topic THEN
        RETURN;
    END IF;
    SELECT o.topic INTO foreign_topic FROM idempotency.outbox o
     WHERE o.id = ANY (ids) AND o.topic <> ALL (scope.topics) LIMIT 1;
    IF FOUND THEN
        PERFORM idempotency.refuse_topic(what, foreign_topic);
    END IF;
END
$$;

-- A bigint[] argument without NULL elements.
CREATE FUNCTION idempotency.check_ids(ids pg_catalog.int8[], name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF ids IS NULL THEN
        PERFORM idempotency.raise_null(name);
    ELSIF array_position(ids, NULL) IS NOT NULL THEN
        PERFORM idempotency.raise_null('an element of ids');
    END IF;
END
$$;

-- ---------------------------------------------------------------- claims

CREATE FUNCTION idempotency.outbox_claim(
    relay pg_catalog.text,
    batch pg_catalog.int4 DEFAULT 100,
    lease pg_catalog.interval DEFAULT NULL,
    topics pg_catalog.text[] DEFAULT NULL)
RETURNS SETOF idempotency.outbox_delivery
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_relay text := relay;
    scope record;
    wanted text[];
    now timestamptz;
    lease_end timestamptz;
    cap int4 := idempotency.setting_int('outbox_max_attempts', 10);
    run_length int4 := idempotency.setting_int('outbox_run_length', 1);
    head record;
    follower record;
    due int8[];
    heads int8[] := '{}';
    handed int4 := 0;
    taken int4;
BEGIN
    PERFORM idempotency.check_name(p_relay, 'relay');
    IF batch IS NULL THEN
        PERFORM idempotency.raise_null('batch');
    ELSIF batch < 1 OR batch > 10000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    lease := idempotency.lease_arg(lease, 'lease');
    IF topics IS NOT NULL THEN
        IF array_position(topics, NULL) IS NOT NULL THEN
            PERFORM idempotency.raise_null('an element of topics');
        END IF;
        PERFORM idempotency.check_name(t, 'topic') FROM unnest(topics) AS t;
    END IF;
    scope := idempotency.relay_topics();
    wanted := topics;
    IF NOT scope.every_topic THEN
        IF topics IS NULL THEN
            wanted := scope.topics;
        ELSE
            PERFORM idempotency.refuse_topic('claim', t) FROM unnest(topics) AS t
              WHERE t <> ALL (scope.topics) LIMIT 1;
        END IF;
    END IF;
    now := clock_timestamp();
    lease_end := now + lease;

    -- In a read-only transaction (or on a standby) a claim that finds
    -- nothing due answers nothing, and one that would lock an event fails
    -- as the lock does, as in the C++ extension.
    IF current_setting('transaction_read_only')::bool THEN
        IF EXISTS (SELECT FROM idempotency.outbox o
                    WHERE o.ready_at IS NOT NULL AND o.ready_at <= now
                      AND (wanted IS NULL OR o.topic = ANY (wanted))
                      AND (o.state = 'pending'
                           OR (o.state = 'in_flight' AND o.attempts < COALESCE(o.max_attempts, cap)))) THEN
            RAISE EXCEPTION 'cannot execute SELECT FOR NO KEY UPDATE in a read-only transaction'
                USING ERRCODE = 'read_only_sql_transaction';
        END IF;
        RETURN;
    END IF;
    -- The due heads, oldest ready first; heads in flight whose lease ran
    -- out with no attempts left are the sweep's to bury. Locked first and
    -- written only when there are any, so that a claim that hands out
    -- nothing runs no UPDATE (its statement triggers do not fire), as in
    -- the C++ extension.
    SELECT array_agg(d.id ORDER BY d.ready_at, d.id) INTO due
      FROM (SELECT o.id, o.ready_at FROM idempotency.outbox o
             WHERE o.ready_at IS NOT NULL AND o.ready_at <= now
               AND (wanted IS NULL OR o.topic = ANY (wanted))
               AND (o.state = 'pending'
                    OR (o.state = 'in_flight' AND o.attempts < COALESCE(o.max_attempts, cap)))
             ORDER BY o.ready_at, o.id
             LIMIT batch
               FOR NO KEY UPDATE SKIP LOCKED) d;
    IF due IS NULL THEN
        RETURN;
    END IF;
    -- Handed out in that order (an UPDATE returns its rows in its scan's).
    FOR head IN
        WITH claimed AS (
            UPDATE idempotency.outbox o
               SET state = 'in_flight', attempts = o.attempts + 1, lease_until = lease_end, ready_at = lease_end,
                   relay = p_relay, updated_at = now, max_attempts = cap
              FROM unnest(due) WITH ORDINALITY AS d (id, n) WHERE o.id = d.id
            RETURNING d.n, o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts, o.enqueued_at,
                      COALESCE(o.key_seq, o.id) AS place)
        SELECT * FROM claimed ORDER BY claimed.n
    LOOP
        handed := handed + 1;
        RETURN NEXT ROW(head.id, head.topic, head.key, head.payload, head.headers, head.dedup_key,
                        head.attempts, head.enqueued_at)::idempotency.outbox_delivery;
        IF head.key IS NOT NULL THEN
            heads := heads || head.id;
        END IF;
    END LOOP;

    -- Runs: in the room left, the events waiting behind each keyed head in
    -- its key's order, each due and free, stopping at the first that is not.
    IF run_length > 1 THEN
        FOR head IN SELECT o.id, o.topic, o.key, COALESCE(o.key_seq, o.id) AS place
                      FROM unnest(heads) WITH ORDINALITY AS h (id, n) JOIN idempotency.outbox o ON o.id = h.id
                     ORDER BY h.n
        LOOP
            EXIT WHEN handed >= batch;
            taken := 0;
            FOR follower IN
                SELECT o.id, o.state, o.available_at, o.lease_until, o.attempts, o.max_attempts
                  FROM idempotency.outbox o
                 WHERE hashtextextended(o.key, hashtextextended(o.topic, 0))
                       = hashtextextended(head.key, hashtextextended(head.topic, 0))
                   AND o.state IN ('pending', 'in_flight', 'dead') AND o.key IS NOT NULL
                   AND o.topic = head.topic AND o.key = head.key
                   AND (COALESCE(o.key_seq, o.id), o.id) > (head.place, head.id)
                 ORDER BY hashtextextended(o.key, hashtextextended(o.topic, 0)), COALESCE(o.key_seq, o.id), o.id
            LOOP
                EXIT WHEN taken >= run_length - 1 OR handed >= batch;
                EXIT WHEN NOT ((follower.state = 'pending' AND follower.available_at <= now)
                               OR (follower.state = 'in_flight' AND follower.lease_until <= now
                                   AND follower.attempts < COALESCE(follower.max_attempts, cap)));
                UPDATE idempotency.outbox o
                   SET state = 'in_flight', attempts = o.attempts + 1, lease_until = lease_end,
                       relay = p_relay, updated_at = now, max_attempts = cap
                 WHERE o.id = (SELECT l.id FROM idempotency.outbox l WHERE l.id = follower.id
                                  AND l.state = follower.state FOR NO KEY UPDATE SKIP LOCKED)
                RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts, o.enqueued_at
                     INTO follower;
                EXIT WHEN follower.id IS NULL;
                taken := taken + 1;
                handed := handed + 1;
                RETURN NEXT ROW(follower.id, follower.topic, follower.key, follower.payload, follower.headers,
                                follower.dedup_key, follower.attempts, follower.enqueued_at)::idempotency.outbox_delivery;
            END LOOP;
        END LOOP;
    END IF;
END
$$;

-- ---------------------------------------------------------------- the relay's answers

CREATE FUNCTION idempotency.outbox_ack(ids pg_catalog.int8[])
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now timestamptz := clock_timestamp();
    changed int8;
    ended record;
BEGIN
    PERFORM idempotency.check_ids(ids, 'ids');
    PERFORM idempotency.check_event_topics(ids, 'ack');
    -- Keys' turns in one order, so that two acks never wait in a cycle.
    PERFORM idempotency.take_key_turn(k.topic, k.key)
       FROM (SELECT DISTINCT o.topic, o.key FROM idempotency.outbox o
              WHERE o.id = ANY (ids) AND o.key IS NOT NULL
                AND (o.state = 'in_flight' OR (o.state = 'pending' AND o.attempts > 0))
              ORDER BY 1, 2) AS k;
    -- Delivered: in flight, or pending after an attempt (a late ack after
    -- its lease ran out: the event was delivered).
    WITH acked AS (
        UPDATE idempotency.outbox o
           SET state = 'delivered', delivered_at = now, lease_until = NULL, ready_at = NULL, updated_at = now
         WHERE o.id = ANY (ids) AND (o.state = 'in_flight' OR (o.state = 'pending' AND o.attempts > 0))
        RETURNING o.topic, o.key)
    SELECT count(*) INTO changed FROM acked;
    -- The next event of each key whose head was acked becomes its head.
    FOR ended IN SELECT DISTINCT o.topic, o.key FROM idempotency.outbox o
                  WHERE o.id = ANY (ids) AND o.key IS NOT NULL AND o.state = 'delivered'
                    AND o.delivered_at = now
    LOOP
        PERFORM idempotency.make_head(ended.topic, ended.key, now);
    END LOOP;
    RETURN changed;
END
$$;

CREATE FUNCTION idempotency.outbox_nack(
    id pg_catalog.int8,
    error pg_catalog.text,
    retryable pg_catalog.bool DEFAULT true,
    retry_in pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.outbox_state
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_id int8 := id;
    p_error text := error;
    event record;
    dead bool;
    due timestamptz;
    now timestamptz;
BEGIN
    IF p_id IS NULL THEN
        PERFORM idempotency.raise_null('id');
    END IF;
    IF p_error IS NULL THEN
        PERFORM idempotency.raise_null('error');
    END IF;
    PERFORM idempotency.check_value_size(octet_length(p_error), 'error');
    IF retryable IS NULL THEN
        PERFORM idempotency.raise_null('retryable');
    END IF;
    retry_in := idempotency.span_arg(retry_in, 'retry_in');
    PERFORM idempotency.check_event_topics(ARRAY[p_id], 'nack');
    SELECT o.state, o.attempts, o.max_attempts INTO event FROM idempotency.outbox o
     WHERE o.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox event % does not exist', p_id USING ERRCODE = 'IK002';
    END IF;
    -- Only an event in flight can fail; any other keeps its state.
    IF event.state <> 'in_flight' THEN
        RETURN event.state;
    END IF;
    now := clock_timestamp();
    dead := NOT retryable
            OR event.attempts >= COALESCE(event.max_attempts, idempotency.setting_int('outbox_max_attempts', 10));
    due := now + CASE WHEN dead THEN interval '0' ELSE COALESCE(retry_in, idempotency.backoff(event.attempts)) END;
    -- A dead event, and one waiting behind its key's head, have no ready place.
    -- attempts and relay are set as they are, as the C++ extension's nack
    -- names them (a user's UPDATE OF trigger fires alike).
    UPDATE idempotency.outbox o
       SET state = CASE WHEN dead THEN 'dead' ELSE 'pending' END::idempotency.outbox_state,
           last_error = p_error, available_at = due, lease_until = NULL, updated_at = now,
           attempts = o.attempts, relay = o.relay,
           ready_at = CASE WHEN dead OR (o.key IS NOT NULL AND o.ready_at IS NULL) THEN NULL ELSE due END
     WHERE o.id = p_id;
    RETURN CASE WHEN dead THEN 'dead' ELSE 'pending' END;
END
$$;

-- Events in flight that `relay` claimed go back to pending at once, their
-- attempt not counted: for a relay that will not deliver them in time.
CREATE FUNCTION idempotency.outbox_release(
    ids pg_catalog.int8[],
    relay pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_relay text := relay;
    now timestamptz := clock_timestamp();
    released int8;
BEGIN
    PERFORM idempotency.check_ids(ids, 'ids');
    PERFORM idempotency.check_name(p_relay, 'relay');
    PERFORM idempotency.check_event_topics(ids, 'release');
    WITH given_back AS (
        UPDATE idempotency.outbox o
           SET state = 'pending', attempts = o.attempts - 1, available_at = now, lease_until = NULL,
               updated_at = now,
               ready_at = CASE WHEN o.key IS NOT NULL AND o.ready_at IS NULL THEN NULL ELSE now END
         WHERE o.id = ANY (ids) AND o.state = 'in_flight' AND o.relay = p_relay
        RETURNING 1)
    SELECT count(*) INTO released FROM given_back;
    RETURN released;
END
$$;

CREATE FUNCTION idempotency.outbox_redrive(
    ids pg_catalog.int8[] DEFAULT NULL,
    topic pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p_topic text := topic;
    scope record;
    now timestamptz := clock_timestamp();
    changed int8 := 0;
    redriven record;
BEGIN
    IF ids IS NOT NULL THEN
        PERFORM idempotency.check_ids(ids, 'ids');
    END IF;
    IF p_topic IS NOT NULL THEN
        PERFORM idempotency.check_name(p_topic, 'topic');
    END IF;
    -- A relay role redrives only its own topics' dead letters.
    scope := idempotency.relay_topics();
    IF p_topic IS NOT NULL AND NOT scope.every_topic AND p_topic <> ALL (scope.topics) THEN
        PERFORM idempotency.refuse_topic('redrive', p_topic);
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM idempotency.check_event_topics(ids, 'redrive');
    END IF;
    PERFORM idempotency.take_key_turn(k.topic, k.key)
       FROM (SELECT DISTINCT o.topic, o.key FROM idempotency.outbox o
              WHERE o.state = 'dead' AND o.key IS NOT NULL AND (ids IS NULL OR o.id = ANY (ids))
                AND (p_topic IS NULL OR o.topic = p_topic)
                AND (scope.every_topic OR o.topic = ANY (scope.topics))
              ORDER BY 1, 2) AS k;
    FOR redriven IN
        UPDATE idempotency.outbox o
           SET state = 'pending', attempts = 0, available_at = now, lease_until = NULL, updated_at = now,
               ready_at = CASE WHEN o.key IS NULL THEN now END
         WHERE o.state = 'dead' AND (ids IS NULL OR o.id = ANY (ids))
           AND (p_topic IS NULL OR o.topic = p_topic)
           AND (scope.every_topic OR o.topic = ANY (scope.topics))
        RETURNING o.topic, o.key
    LOOP
        changed := changed + 1;
        IF redriven.key IS NOT NULL THEN
            PERFORM idempotency.make_head(redriven.topic, redriven.key, now);
        END IF;
    END LOOP;
    RETURN changed;
END
$$;

-- Dead events an operator gives up on: deleted, and the next event of each
-- key they held back becomes its head.
CREATE FUNCTION idempotency.outbox_discard(ids pg_catalog.int8[])
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    scope record;
    now timestamptz := clock_timestamp();
    discarded int8 := 0;
    gone record;
BEGIN
    PERFORM idempotency.check_ids(ids, 'ids');
    scope := idempotency.relay_topics();
    PERFORM idempotency.check_event_topics(ids, 'discard');
    PERFORM idempotency.take_key_turn(k.topic, k.key)
       FROM (SELECT DISTINCT o.topic, o.key FROM idempotency.outbox o
              WHERE o.id = ANY (ids) AND o.state = 'dead' AND o.key IS NOT NULL ORDER BY 1, 2) AS k;
    FOR gone IN
        DELETE FROM idempotency.outbox o
         WHERE o.id = ANY (ids) AND o.state = 'dead' AND (scope.every_topic OR o.topic = ANY (scope.topics))
        RETURNING o.topic, o.key
    LOOP
        discarded := discarded + 1;
        IF gone.key IS NOT NULL THEN
            PERFORM idempotency.make_head(gone.topic, gone.key, now);
        END IF;
    END LOOP;
    RETURN discarded;
END
$$;
