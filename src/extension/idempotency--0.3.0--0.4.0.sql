-- idempotency 0.3.0 -> 0.4.0: safe to install in someone else's database.
-- The schema must be the extension owner's and hold only the extension's
-- objects; no function is executable by PUBLIC (the grant_* functions give
-- each kind of role its rights, relays by topic); pg_dump keeps every row;
-- DROP EXTENSION refuses to destroy undelivered work; a key records the
-- attempt cap and retention its claim decided, for the sweep.
-- A fresh install runs the 0.3.0 script and then this one.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------- the schema

-- A schema that another role created first (a database owner can) would let
-- that role rename it and put look-alike objects under the old names: the
-- schema must belong to the extension's owner (or to a superuser, as after a
-- restore by another superuser) and hold nothing else.
DO $check$
DECLARE
    schema_oid pg_catalog.oid := 'idempotency'::pg_catalog.regnamespace;
    schema_owner pg_catalog.name;
    schema_owner_is_superuser pg_catalog.bool;
    extension_owner pg_catalog.name;
    stranger pg_catalog.text;
BEGIN
    SELECT so.rolname, so.rolsuper, eo.rolname INTO schema_owner, schema_owner_is_superuser, extension_owner
      FROM pg_catalog.pg_namespace n, pg_catalog.pg_extension e, pg_catalog.pg_roles so,
           pg_catalog.pg_roles eo
     WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND e.extname OPERATOR(pg_catalog.=) 'idempotency'
       AND so.oid OPERATOR(pg_catalog.=) n.nspowner AND eo.oid OPERATOR(pg_catalog.=) e.extowner;
    IF schema_owner OPERATOR(pg_catalog.<>) extension_owner AND NOT schema_owner_is_superuser THEN
        RAISE EXCEPTION 'schema idempotency belongs to role %, not to the extension''s owner %',
                        schema_owner, extension_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Install into a schema of your own (drop the existing schema first). '
                         'For an existing install: check what the schema holds, then '
                         'ALTER SCHEMA idempotency OWNER TO ' || pg_catalog.quote_ident(extension_owner)
                         || ' and update again.';
    END IF;
    -- Objects of the schema that are neither members of the extension nor
    -- parts of one (an index, a constraint, a row or array type, an owned
    -- sequence), however deep.
    WITH RECURSIVE ours (classid, objid) AS (
        SELECT d.classid, d.objid FROM pg_catalog.pg_depend d, pg_catalog.pg_extension e
         WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) e.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
        UNION
        SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
          JOIN ours o ON d.refclassid OPERATOR(pg_catalog.=) o.classid
                     AND d.refobjid OPERATOR(pg_catalog.=) o.objid
         WHERE d.deptype OPERATOR(pg_catalog.=) ANY ('{a,i}')),
    contents (classid, objid) AS (
        SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, oid FROM pg_catalog.pg_class
         WHERE relnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, oid FROM pg_catalog.pg_proc
         WHERE pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, oid FROM pg_catalog.pg_type
         WHERE typnamespace OPERATOR(pg_catalog.=) schema_oid  -- row and array types go with theirs
           AND typrelid OPERATOR(pg_catalog.=) 0 AND typelem OPERATOR(pg_catalog.=) 0
        UNION ALL SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, oid FROM pg_catalog.pg_operator
         WHERE oprnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, oid FROM pg_catalog.pg_collation
         WHERE collnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, oid FROM pg_catalog.pg_conversion
         WHERE connamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, oid FROM pg_catalog.pg_opclass
         WHERE opcnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, oid FROM pg_catalog.pg_opfamily
         WHERE opfnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_config
         WHERE cfgnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_dict
         WHERE dictnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_ts_parser'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_parser
         WHERE prsnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_ts_template'::pg_catalog.regclass, oid FROM pg_catalog.pg_ts_template
         WHERE tmplnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, oid FROM pg_catalog.pg_statistic_ext
         WHERE stxnamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL SELECT 'pg_catalog.pg_extension'::pg_catalog.regclass, oid FROM pg_catalog.pg_extension
         WHERE extnamespace OPERATOR(pg_catalog.=) schema_oid AND extname OPERATOR(pg_catalog.<>) 'idempotency')
    SELECT pg_catalog.string_agg(pg_catalog.pg_describe_object(c.classid, c.objid, 0), ', ')
      INTO stranger
      FROM contents c
     WHERE NOT EXISTS (SELECT FROM ours o WHERE o.classid OPERATOR(pg_catalog.=) c.classid
                                            AND o.objid OPERATOR(pg_catalog.=) c.objid);
    IF stranger IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency holds objects that are not the extension''s: %', stranger
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'The extension works only in a schema of its own: move or drop those objects first.';
    END IF;
END
$check$;

-- ---------------------------------------------------------------- keys

-- What the claim's settings decided, for a sweep that expires its lease
-- later: attempts before a failure is final, and how long the key is kept
-- once it is. NULL: the server's settings.
ALTER TABLE idempotency.idempotency_keys
    ADD COLUMN max_attempts pg_catalog.int4,
    ADD COLUMN retention pg_catalog.interval;

-- ---------------------------------------------------------------- outbox

-- The attempt cap of the session that claimed an event, for the sweep that
-- expires its lease. NULL: the sweep's own setting.
ALTER TABLE idempotency.outbox ADD COLUMN max_attempts pg_catalog.int4;

-- Events in flight that `relay` claimed go back to pending at once, their
-- attempt not counted: for a relay that will not deliver them in time.
CREATE FUNCTION idempotency.outbox_release(
    ids pg_catalog.int8[],
    relay pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_release';

-- ---------------------------------------------------------------- drop guard

-- DROP EXTENSION (or DROP SCHEMA ... CASCADE, DROP OWNED) is refused while
-- the outbox holds undelivered events or keys are PROCESSING, unless
-- idempotency.force_drop is on; and always inside a transaction that holds
-- outbox claims it has not written yet.
CREATE FUNCTION idempotency.drop_guard()
RETURNS event_trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_drop_guard';

CREATE EVENT TRIGGER idempotency_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION idempotency.drop_guard();

-- ---------------------------------------------------------------- roles

-- The topics each relay role may claim, ack, nack, release and redrive; NULL
-- topics: every topic. A role with no row here and the right to execute
-- the relay functions (granted by hand) is not limited.
CREATE TABLE idempotency.relay_grants (
    role   pg_catalog.regrole PRIMARY KEY,
    topics pg_catalog.text[]
);
REVOKE ALL ON idempotency.relay_grants FROM PUBLIC;

-- No function is executable by PUBLIC; each kind of role gets what it needs.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idempotency FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.stuck_after() TO pg_monitor;

-- The functions and views of each kind of role.
CREATE TABLE idempotency.role_kind_rights (
    kind pg_catalog.text NOT NULL,
    object pg_catalog.text NOT NULL,   -- a function's signature, or a view's name
    is_view pg_catalog.bool NOT NULL,
    PRIMARY KEY (kind, object)
);
REVOKE ALL ON idempotency.role_kind_rights FROM PUBLIC;
INSERT INTO idempotency.role_kind_rights (kind, object, is_view) VALUES
    ('application', 'idem_register(text,jsonb,text,text)', false),
    ('application', 'idem_claim(text,jsonb,interval,text,interval)', false),
    ('application', 'idem_complete(text,bigint,jsonb,text,interval)', false),
    ('application', 'idem_fail(text,bigint,text,boolean,interval,text)', false),
    ('application', 'idem_heartbeat(text,bigint,interval,text)', false),
    ('application', 'idem_release(text,bigint,text)', false),
    ('application', 'idem_get(text,text)', false),
    ('application', 'idem_assert_owner(text,bigint,text)', false),
    ('application', 'inbox_receive(text,text,jsonb)', false),
    ('application', 'idem_lock(text,interval,text,interval)', false),
    ('application', 'idem_lock_renew(text,bigint,interval)', false),
    ('application', 'idem_unlock(text,bigint)', false),
    ('application', 'idem_lock_assert(text,bigint)', false),
    ('application', 'outbox_enqueue(text,jsonb,text,jsonb,text,timestamp with time zone)', false),
    ('relay', 'outbox_claim(text,integer,interval,text[])', false),
    ('relay', 'outbox_ack(bigint[])', false),
    ('relay', 'outbox_nack(bigint,text,boolean,interval)', false),
    ('relay', 'outbox_release(bigint[],text)', false),
    ('relay', 'outbox_redrive(bigint[],text)', false),
    ('relay', 'stuck_after()', false),
    ('relay', 'outbox_lag', true),
    ('monitoring', 'idem_metrics_row()', false),
    ('monitoring', 'stuck_after()', false),
    ('monitoring', 'idem_stats', true),
    ('monitoring', 'idem_stuck', true),
    ('monitoring', 'outbox_lag', true),
    ('monitoring', 'outbox_dead_letters', true),
    ('monitoring', 'idem_metrics', true),
    ('admin', 'idem_maintenance()', false),
    ('admin', 'idem_metrics_reset()', false);

CREATE FUNCTION idempotency.role_rights(kind pg_catalog.text,
    OUT functions pg_catalog.text[], OUT views pg_catalog.text[])
LANGUAGE sql STABLE
AS $$
SELECT pg_catalog.array_agg(r.object ORDER BY r.object) FILTER (WHERE NOT r.is_view),  -- NULL: no such kind
       COALESCE(pg_catalog.array_agg(r.object ORDER BY r.object) FILTER (WHERE r.is_view),
                '{}'::pg_catalog.text[])
  FROM idempotency.role_kind_rights r
 WHERE r.kind OPERATOR(pg_catalog.=) role_rights.kind
$$;

-- Grants (or, with revoke, takes back) the rights of one kind of role.
CREATE FUNCTION idempotency.set_role_rights(role pg_catalog.regrole, kind pg_catalog.text,
                                            take_back pg_catalog.bool)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    rights record;
    object pg_catalog.text;
BEGIN
    SELECT * INTO rights FROM idempotency.role_rights(kind);
    IF rights.functions IS NULL THEN
        RAISE EXCEPTION 'unknown kind of role "%"', kind USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH object IN ARRAY rights.functions LOOP
        EXECUTE format(CASE WHEN take_back THEN 'REVOKE EXECUTE ON FUNCTION idempotency.%s FROM %s'
                            ELSE 'GRANT EXECUTE ON FUNCTION idempotency.%s TO %s' END, object, role);
    END LOOP;
    FOREACH object IN ARRAY rights.views LOOP
        EXECUTE format(CASE WHEN take_back THEN 'REVOKE SELECT ON idempotency.%I FROM %s'
                            ELSE 'GRANT SELECT ON idempotency.%I TO %s' END, object, role);
    END LOOP;
    IF NOT take_back THEN
        EXECUTE format('GRANT USAGE ON SCHEMA idempotency TO %s', role);
    END IF;
END
$$;

-- Keys, inbox, resource locks and outbox_enqueue: what services need.
CREATE FUNCTION idempotency.grant_application(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$ SELECT idempotency.set_role_rights(role, 'application', false) $$;

-- Claim, ack, nack, release and redrive the events of `topics` (NULL: every
-- topic); granting again replaces the topics.
CREATE FUNCTION idempotency.grant_relay(role pg_catalog.regrole,
                                        topics pg_catalog.text[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    IF topics IS NOT NULL AND (pg_catalog.array_position(topics, NULL) IS NOT NULL
                               OR pg_catalog.cardinality(topics) = 0) THEN
        RAISE EXCEPTION 'topics must be NULL (every topic) or a non-empty list without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM idempotency.set_role_rights(role, 'relay', false);
    INSERT INTO idempotency.relay_grants AS g (role, topics) VALUES (role, topics)
        ON CONFLICT ON CONSTRAINT relay_grants_pkey DO UPDATE SET topics = excluded.topics;
END
$$;

-- The views and idem_metrics.
CREATE FUNCTION idempotency.grant_monitoring(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$ SELECT idempotency.set_role_rights(role, 'monitoring', false) $$;

-- Everything: the other three kinds, idem_maintenance and idem_metrics_reset.
CREATE FUNCTION idempotency.grant_admin(role pg_catalog.regrole)
RETURNS void LANGUAGE sql SET search_path = pg_catalog
AS $$
SELECT idempotency.set_role_rights(role, 'application', false);
SELECT idempotency.grant_relay(role, NULL);
SELECT idempotency.set_role_rights(role, 'monitoring', false);
SELECT idempotency.set_role_rights(role, 'admin', false);
$$;

-- Takes back every right the grant_* functions gave the role.
CREATE FUNCTION idempotency.revoke_role(role pg_catalog.regrole)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
DECLARE
    kind pg_catalog.text;
BEGIN
    FOREACH kind IN ARRAY ARRAY['application', 'relay', 'monitoring', 'admin'] LOOP
        PERFORM idempotency.set_role_rights(role, kind, true);
    END LOOP;
    DELETE FROM idempotency.relay_grants g WHERE g.role = revoke_role.role;
    EXECUTE format('REVOKE USAGE ON SCHEMA idempotency FROM %s', role);
END
$$;

REVOKE ALL ON FUNCTION idempotency.role_rights(pg_catalog.text),
    idempotency.set_role_rights(pg_catalog.regrole, pg_catalog.text, pg_catalog.bool),
    idempotency.grant_application(pg_catalog.regrole),
    idempotency.grant_relay(pg_catalog.regrole, pg_catalog.text[]),
    idempotency.grant_monitoring(pg_catalog.regrole),
    idempotency.grant_admin(pg_catalog.regrole),
    idempotency.revoke_role(pg_catalog.regrole) FROM PUBLIC;

-- ---------------------------------------------------------------- backups

-- pg_dump writes the rows of these tables and the values of the sequences,
-- so that a restore keeps every key, result, event, inbox row, lock and
-- grant, and new tokens and event ids continue above the old ones.
SELECT pg_catalog.pg_extension_config_dump('idempotency.idempotency_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.locks', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.relay_grants', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.token_seq', '');
SELECT pg_catalog.pg_extension_config_dump(
    pg_catalog.pg_get_serial_sequence('idempotency.outbox', 'id')::pg_catalog.regclass, '');
