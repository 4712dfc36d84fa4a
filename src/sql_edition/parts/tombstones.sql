-- ---------------------------------------------------------------- tombstones
--
-- What is left of a finished key once its result's retention has passed
-- (docs/keys.md#tombstones-the-dedup-window-outlives-the-result). The
-- purge (idem_maintenance) moves keys here; a claim or register of a key
-- that is absent answers from its tombstone and never creates the key
-- again. The digest and the fingerprint's prefix are computed exactly as
-- the C++ edition computes them, so that either edition reads the other's
-- tombstones.

-- The first 16 bytes of the SHA-256 of the scope's bytes (digest_bytes), a
-- zero byte and the key's bytes, as a uuid.
CREATE FUNCTION idempotency.tombstone_digest(scope pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.uuid
LANGUAGE sql IMMUTABLE
AS $$
SELECT encode(substr(sha256(idempotency.digest_bytes(scope) || '\x00'::bytea || idempotency.digest_bytes(key)),
                     1, 16), 'hex')::uuid
$$;

-- The first 4 bytes of a fingerprint, read as a big-endian signed integer.
CREATE FUNCTION idempotency.fingerprint_prefix(fingerprint pg_catalog.bytea)
RETURNS pg_catalog.int4
LANGUAGE sql IMMUTABLE
AS $$ SELECT ('x' || encode(substr(fingerprint, 1, 4), 'hex'))::bit(32)::int4 $$;

-- The answer of a tombstone to a claim or register of key (scope, key)
-- that is not in the keys table: completed or failed as the key finished,
-- or mismatch against the prefix of the request's fingerprint (in any form
-- fingerprint_differs accepts, as for a live key); result,
-- token and attempt NULL, result_expired true. NULL when there is none.
CREATE FUNCTION idempotency.tombstone_answer(p_scope pg_catalog.text, p_key pg_catalog.text,
                                             fp pg_catalog.bytea, request pg_catalog.jsonb)
RETURNS idempotency.idem_outcome
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    t idempotency.key_tombstones;
    conflict bool;
BEGIN
    SELECT * INTO t FROM idempotency.key_tombstones s
     WHERE s.key_digest = idempotency.tombstone_digest(p_scope, p_key);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    conflict := t.fingerprint IS NOT NULL AND fp IS NOT NULL
                AND idempotency.fingerprint_prefix(fp) <> t.fingerprint
                AND idempotency.fingerprint_prefix(sha256(idempotency.text_bytes(request::text)))
                    <> t.fingerprint
                AND idempotency.fingerprint_prefix(sha256(idempotency.text_bytes(
                        idempotency.canonical_text(request)))) <> t.fingerprint;
    RETURN ROW(CASE WHEN conflict THEN 'mismatch'
                    WHEN t.status = 'COMPLETED' THEN 'completed' ELSE 'failed' END,
               t.status, NULL, NULL, NULL, NULL, NULL, NULL, true, NULL)::idempotency.idem_outcome;
END
$$;

-- Under REPEATABLE READ or SERIALIZABLE, for a claim or register that has
-- just inserted the key because neither it nor its tombstone was in the
-- transaction's snapshot: raises 40001 when a purge committed the key's
-- tombstone after that snapshot (the key was finished and purged
-- meanwhile, so the work must not run again). The probe is an insert of
-- the tombstone, which a conflict with a row the snapshot cannot see fails
-- with 40001; its subtransaction is always rolled back. Nothing under READ
-- COMMITTED, whose statements see the purge.
CREATE FUNCTION idempotency.refuse_if_tombstone_made(p_scope pg_catalog.text, p_key pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO idempotency.key_tombstones (key_digest, forget_at, status)
        VALUES (idempotency.tombstone_digest(p_scope, p_key), '-infinity', 'COMPLETED')
        ON CONFLICT DO NOTHING;
        RAISE SQLSTATE 'IKW00';
    EXCEPTION
        WHEN SQLSTATE 'IKW00' THEN
            RETURN;
        WHEN serialization_failure THEN
            PERFORM idempotency.raise_changed_since_snapshot(p_scope, p_key,
                                                             'it was finished and purged into its tombstone');
    END;
END
$$;
