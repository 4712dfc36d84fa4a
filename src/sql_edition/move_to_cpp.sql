-- The move of a database from the SQL edition to the C++ extension
-- (docs/managed-postgres.md#moving-to-the-c-extension), in one transaction:
-- every key (with its token, steps and fingerprint), tombstone, outbox
-- event (pending, in flight, delivered, dead, with its id), inbox row and
-- lock, the token and event id sequences where they were, and the rights
-- the grant_* functions gave each role. Tokens handed out before the move
-- still fence after it; ids keep growing from where they were.
--
-- Run it as a superuser, with the C++ extension installed on the server
-- (make install, shared_preload_libraries = 'idempotency'), while no
-- session uses the edition (it waits for the tables' locks, then holds
-- every caller until it commits):
--     psql -v ON_ERROR_STOP=1 -d app -f move_to_cpp.sql
-- Both editions must be of one version (this script: that of the C++
-- extension's default_version); update the SQL edition first.

\set ON_ERROR_STOP on
BEGIN;

-- Callers wait from here on; the copy below is of every committed row.
LOCK TABLE idempotency.idempotency_keys, idempotency.key_tombstones, idempotency.inbox,
    idempotency.locks, idempotency.outbox, idempotency.relay_grants IN ACCESS EXCLUSIVE MODE;

DO $check$
DECLARE
    edition_version text;
    cpp_version text;
    outside text;
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'idempotency') THEN
        RAISE EXCEPTION 'the C++ extension is installed already' USING ERRCODE = 'duplicate_object';
    END IF;
    SELECT extversion INTO edition_version FROM pg_extension WHERE extname = 'idempotency_sql';
    IF edition_version IS NULL THEN
        IF to_regprocedure('idempotency.sql_edition_version()') IS NULL THEN
            RAISE EXCEPTION 'schema idempotency holds no SQL edition' USING ERRCODE = 'undefined_object';
        END IF;
        EXECUTE 'SELECT idempotency.sql_edition_version()' INTO edition_version;
    END IF;
    SELECT default_version INTO cpp_version FROM pg_available_extensions WHERE name = 'idempotency';
    IF cpp_version IS NULL THEN
        RAISE EXCEPTION 'the C++ extension is not installed on this server' USING ERRCODE = 'undefined_file',
            HINT = 'make install, and shared_preload_libraries = ''idempotency''.';
    ELSIF cpp_version <> edition_version THEN
        RAISE EXCEPTION 'the SQL edition is %, the C++ extension %: move between one version', edition_version,
                        cpp_version USING ERRCODE = 'feature_not_supported',
            HINT = 'Update the SQL edition first (docs/managed-postgres.md).';
    END IF;
    -- The edition is dropped below: nothing outside its schema may depend
    -- on it (a view over its tables, a column of its types), or the drop
    -- would take it along.
    SELECT string_agg(DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid), ', ') INTO outside
      FROM pg_depend d
      CROSS JOIN LATERAL (SELECT CASE d.refclassid
                 WHEN 'pg_class'::regclass THEN (SELECT relnamespace FROM pg_class WHERE oid = d.refobjid)
                 WHEN 'pg_type'::regclass THEN (SELECT typnamespace FROM pg_type WHERE oid = d.refobjid)
                 WHEN 'pg_proc'::regclass THEN (SELECT pronamespace FROM pg_proc WHERE oid = d.refobjid)
               END AS schema) referenced
      CROSS JOIN LATERAL (SELECT CASE d.classid
                 WHEN 'pg_class'::regclass THEN (SELECT relnamespace FROM pg_class WHERE oid = d.objid)
                 WHEN 'pg_type'::regclass THEN (SELECT typnamespace FROM pg_type WHERE oid = d.objid)
                 WHEN 'pg_proc'::regclass THEN (SELECT pronamespace FROM pg_proc WHERE oid = d.objid)
                 WHEN 'pg_constraint'::regclass THEN (SELECT connamespace FROM pg_constraint WHERE oid = d.objid)
                 WHEN 'pg_rewrite'::regclass THEN (SELECT c.relnamespace FROM pg_rewrite r
                                                     JOIN pg_class c ON c.oid = r.ev_class WHERE r.oid = d.objid)
                 WHEN 'pg_trigger'::regclass THEN (SELECT c.relnamespace FROM pg_trigger t
                                                     JOIN pg_class c ON c.oid = t.tgrelid WHERE t.oid = d.objid)
                 WHEN 'pg_attrdef'::regclass THEN (SELECT c.relnamespace FROM pg_attrdef a
                                                     JOIN pg_class c ON c.oid = a.adrelid WHERE a.oid = d.objid)
               END AS schema) dependent
     WHERE referenced.schema = 'idempotency'::regnamespace AND d.deptype IN ('n', 'a')
       AND dependent.schema IS DISTINCT FROM 'idempotency'::regnamespace;
    IF outside IS NOT NULL THEN
        RAISE EXCEPTION 'objects outside schema idempotency depend on the SQL edition: %', outside
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = 'Drop them, move, and create them again.';
    END IF;
END
$check$;

-- The rows, as the text of each (types and columns are the same in both
-- editions; the text survives the drop of the edition's types).
CREATE TEMP TABLE moving_keys ON COMMIT DROP AS SELECT k::text AS r FROM idempotency.idempotency_keys k;
CREATE TEMP TABLE moving_tombstones ON COMMIT DROP AS SELECT t::text AS r FROM idempotency.key_tombstones t;
CREATE TEMP TABLE moving_inbox ON COMMIT DROP AS SELECT i::text AS r FROM idempotency.inbox i;
CREATE TEMP TABLE moving_locks ON COMMIT DROP AS SELECT l::text AS r FROM idempotency.locks l;
CREATE TEMP TABLE moving_outbox ON COMMIT DROP AS SELECT o::text AS r FROM idempotency.outbox o;
CREATE TEMP TABLE moving_sequences ON COMMIT DROP AS
SELECT (SELECT last_value FROM idempotency.token_seq) AS token_last,
       (SELECT is_called FROM idempotency.token_seq) AS token_called,
       pg_get_serial_sequence('idempotency.outbox', 'id') AS outbox_seq,
       NULL::int8 AS outbox_last, NULL::bool AS outbox_called;
DO $seq$
DECLARE
    last int8;
    called bool;
BEGIN
    EXECUTE format('SELECT last_value, is_called FROM %s', (SELECT outbox_seq FROM moving_sequences))
        INTO last, called;
    UPDATE moving_sequences SET outbox_last = last, outbox_called = called;
END
$seq$;

-- The rights: a role has a kind when it holds every function of the kind
-- (role_kind_rights) by a grant of its own; a relay its topics.
CREATE TEMP TABLE moving_rights ON COMMIT DROP AS
SELECT r.rolname::text AS role, k.kind, (SELECT g.topics FROM idempotency.relay_grants g WHERE g.role = r.oid) AS topics
  FROM pg_roles r
 CROSS JOIN (SELECT DISTINCT kind FROM idempotency.role_kind_rights) k
 WHERE r.oid <> (SELECT nspowner FROM pg_namespace WHERE nspname = 'idempotency')
   AND NOT EXISTS (
       SELECT FROM idempotency.role_kind_rights w
        WHERE w.kind = k.kind AND NOT w.is_view
          AND NOT EXISTS (SELECT FROM pg_proc p, aclexplode(p.proacl) a
                           WHERE p.oid = to_regprocedure('idempotency.' || w.object)
                             AND a.grantee = r.oid AND a.privilege_type = 'EXECUTE'));

-- The edition goes: as an extension (refused if anything depends on it),
-- or, installed by its plain script, with its schema.
DO $drop$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'idempotency_sql') THEN
        DROP EXTENSION idempotency_sql;
        DROP SCHEMA idempotency;
    ELSE
        DROP SCHEMA idempotency CASCADE;
    END IF;
END
$drop$;

CREATE EXTENSION idempotency;

INSERT INTO idempotency.idempotency_keys
SELECT (m.k).* FROM (SELECT r::idempotency.idempotency_keys AS k FROM moving_keys OFFSET 0) m;
INSERT INTO idempotency.key_tombstones
SELECT (m.t).* FROM (SELECT r::idempotency.key_tombstones AS t FROM moving_tombstones OFFSET 0) m;
INSERT INTO idempotency.inbox
SELECT (m.i).* FROM (SELECT r::idempotency.inbox AS i FROM moving_inbox OFFSET 0) m;
INSERT INTO idempotency.locks
SELECT (m.l).* FROM (SELECT r::idempotency.locks AS l FROM moving_locks OFFSET 0) m;
INSERT INTO idempotency.outbox OVERRIDING SYSTEM VALUE
SELECT (m.o).* FROM (SELECT r::idempotency.outbox AS o FROM moving_outbox OFFSET 0) m;

SELECT setval('idempotency.token_seq', token_last, token_called) FROM moving_sequences;
SELECT setval(pg_get_serial_sequence('idempotency.outbox', 'id'), outbox_last, outbox_called)
  FROM moving_sequences;

-- The rights again, by the C++ extension's grant_* functions.
SELECT idempotency.grant_admin(role::regrole) FROM moving_rights WHERE kind = 'admin';
SELECT idempotency.grant_application(role::regrole) FROM moving_rights
 WHERE kind = 'application' AND role NOT IN (SELECT role FROM moving_rights WHERE kind = 'admin');
SELECT idempotency.grant_relay(role::regrole, topics) FROM moving_rights
 WHERE kind = 'relay' AND role NOT IN (SELECT role FROM moving_rights WHERE kind = 'admin');
SELECT idempotency.grant_monitoring(role::regrole) FROM moving_rights
 WHERE kind = 'monitoring' AND role NOT IN (SELECT role FROM moving_rights WHERE kind = 'admin');

-- The background workers learn of the rows written here at their next
-- look (request_sweep needs the library preloaded; without it they are
-- found when it is).
SELECT idempotency.request_sweep()
 WHERE current_setting('shared_preload_libraries') ~ '(^|[ ,])idempotency($|[ ,])';

COMMIT;
