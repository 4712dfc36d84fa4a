-- ---------------------------------------------------------------- the schema

-- The edition lives in schema idempotency, which the installing role owns
-- (it is created when missing) and which holds nothing yet: a schema of
-- another role could be renamed under it and filled with look-alikes.
DO $create$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) 'idempotency') THEN
        CREATE SCHEMA idempotency;
    END IF;
END
$create$;
DO $check$
DECLARE
    schema_owner pg_catalog.name;
    stranger pg_catalog.text;
BEGIN
    SELECT r.rolname INTO schema_owner
      FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency';
    IF schema_owner OPERATOR(pg_catalog.<>) current_user THEN
        RAISE EXCEPTION 'schema idempotency belongs to role %, not to %', schema_owner, current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run the script as the role that owns schema idempotency.';
    END IF;
    SELECT pg_catalog.string_agg(c.relname::pg_catalog.text, ', ') INTO stranger
      FROM pg_catalog.pg_class c
     WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace;
    IF stranger IS NULL THEN
        SELECT pg_catalog.string_agg(p.proname::pg_catalog.text, ', ') INTO stranger
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace;
    END IF;
    IF stranger IS NOT NULL THEN
        RAISE EXCEPTION 'schema idempotency already holds objects: %', stranger
            USING ERRCODE = 'duplicate_object',
                  HINT = 'The edition installs into an empty schema of its own; to update an '
                         'installed edition, run its update script.';
    END IF;
END
$check$;
