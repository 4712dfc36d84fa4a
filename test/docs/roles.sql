-- The roles of the README's install, with their rights in a page's
-- database: what every page of docs/ starts from.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app') THEN CREATE ROLE app LOGIN; END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'relay') THEN CREATE ROLE relay LOGIN; END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'monitoring') THEN CREATE ROLE monitoring LOGIN; END IF;
END $$;
SELECT idempotency.grant_application('app');
SELECT idempotency.grant_relay('relay');
SELECT idempotency.grant_monitoring('monitoring');
