# A role that may create schemas in a database (its owner) never becomes
# superuser through the extension. CREATE EXTENSION refuses a schema
# `idempotency` that another role created first, or one that already holds
# objects. Then the attack that refusal prevents is replayed, with a
# superuser's help, against the defences that do not depend on it: the
# extension's schema is renamed and the attacker puts a look-alike schema
# `idempotency` in its place (the same types, tables, columns, indexes and
# sequences) whose tables carry triggers that would make the attacker
# superuser and write a marker row. Neither the functions (called by an
# application role, and by a superuser) nor the background worker (with no
# call at all, expiring a lease) may touch the look-alike: the real, renamed
# tables are used. A schema handed to another role is not served at all,
# by the functions or the worker, until it is given back.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('takeover');
my $superuser = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql(
	'postgres', q{
CREATE ROLE attacker LOGIN;
CREATE ROLE app LOGIN;
CREATE DATABASE early OWNER attacker;
CREATE DATABASE renamed OWNER attacker;
CREATE DATABASE handed OWNER attacker;});

# (rc, out, err) of SQL run by ROLE in DB.
sub as_role
{
	my ($role, $db, $sql) = @_;
	return $node->psql($db, $sql, extra_params => [ '-U', $role ]);
}

sub attacker_is_superuser
{
	return $node->safe_psql('postgres',
		"SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'") eq 't';
}

# --- the install refuses a schema it does not own, or one that holds objects ------
my ($rc, $out, $err) = as_role('attacker', 'early', 'CREATE SCHEMA idempotency');
is($rc, 0, 'the database owner can create schema idempotency');
($rc, $out, $err) = $node->psql('early', "\\set VERBOSITY verbose\nCREATE EXTENSION idempotency");
isnt($rc, 0, 'CREATE EXTENSION into the schema the database owner created fails');
like(
	$err,
	qr/ERROR:  42501: schema idempotency belongs to role attacker, not to the extension's owner \Q$superuser\E/,
	'... with 42501 naming the schema, its owner and the extension owner');
like($err, qr/HINT:  Install into a schema of your own/, '... and a hint');
is($node->safe_psql('early', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
	'0', 'nothing is installed');
is( $node->safe_psql(
		'early', q{SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'idempotency'}),
	'attacker', "the attacker's schema is left as it was");

# A schema of the installing role that already holds an object of another.
$node->safe_psql(
	'early', qq{
DROP SCHEMA idempotency;
CREATE SCHEMA idempotency;
GRANT CREATE, USAGE ON SCHEMA idempotency TO attacker;});
($rc, $out, $err) = as_role('attacker', 'early', 'CREATE TABLE idempotency.planted (x int)');
is($rc, 0, 'a role with CREATE on the schema plants a table in it');
($rc, $out, $err) = $node->psql('early', 'CREATE EXTENSION idempotency');
isnt($rc, 0, 'CREATE EXTENSION into a schema that holds an object fails');
like(
	$err,
	qr/schema idempotency holds objects that are not the extension's: table (idempotency\.)?planted/,
	'... naming the object');
$node->safe_psql('early', 'DROP TABLE idempotency.planted; REVOKE ALL ON SCHEMA idempotency FROM attacker');
($rc, $out, $err) = $node->psql('early', 'CREATE EXTENSION idempotency');
is($rc, 0, 'an empty schema of the installing role is accepted') or diag($err);

# --- the look-alike --------------------------------------------------------------
# Run by the superuser once the extension's schema is `$real`: the DDL of a
# schema `idempotency` with the same enum types, sequences, tables (columns,
# defaults, constraints) and indexes, written from the catalog. The old
# versions' statements, which named the objects, ran unchanged against it.
sub lookalike_ddl
{
	my ($db, $real) = @_;
	return $node->safe_psql(
		$db, qq{
WITH s AS (SELECT '$real'::regnamespace AS real),
tables AS (SELECT c.oid, c.relname FROM pg_class c, s WHERE c.relnamespace = s.real AND c.relkind = 'r'),
ddl (ord, sql) AS (
    SELECT 1, format('CREATE TYPE idempotency.%I AS ENUM (%s)', t.typname,
                     (SELECT string_agg(quote_literal(enumlabel), ', ' ORDER BY enumsortorder)
                        FROM pg_enum WHERE enumtypid = t.oid))
      FROM pg_type t, s WHERE t.typnamespace = s.real AND t.typtype = 'e'
    UNION ALL
    SELECT 2, format('CREATE SEQUENCE idempotency.%I', c.relname)
      FROM pg_class c, s WHERE c.relnamespace = s.real AND c.relkind = 'S'
       AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
    UNION ALL
    SELECT 3, format('CREATE TABLE idempotency.%I (%s)', t.relname, string_agg(
             format('%I %s%s%s%s', a.attname,
                    CASE WHEN ty.typnamespace = s.real THEN 'idempotency.' || quote_ident(ty.typname)
                         ELSE format_type(a.atttypid, a.atttypmod) END,
                    CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                    CASE WHEN ad.adbin IS NOT NULL
                         THEN ' DEFAULT ' || replace(pg_get_expr(ad.adbin, ad.adrelid), '$real.', 'idempotency.')
                         ELSE '' END,
                    CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                       WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' ELSE '' END),
             ', ' ORDER BY a.attnum))
      FROM tables t CROSS JOIN s
      JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
      JOIN pg_type ty ON ty.oid = a.atttypid
      LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
     GROUP BY t.relname
    UNION ALL
    SELECT 4, format('ALTER TABLE idempotency.%I ADD CONSTRAINT %I %s', t.relname, co.conname,
                     replace(pg_get_constraintdef(co.oid), '$real.', 'idempotency.'))
      FROM tables t JOIN pg_constraint co ON co.conrelid = t.oid AND co.contype <> 'n'
    UNION ALL
    SELECT 5, replace(pg_get_indexdef(i.indexrelid), '$real.', 'idempotency.')
      FROM tables t JOIN pg_index i ON i.indrelid = t.oid
     WHERE NOT EXISTS (SELECT FROM pg_constraint co WHERE co.conindid = i.indexrelid))
SELECT string_agg(sql, E';\\n' ORDER BY ord, sql) || ';' FROM ddl});
}

# The attacker's schema `idempotency` (look-alike tables with a row of bait
# each the sweep would change), and schema `trap`: a marker table anyone may
# write, and triggers (before each statement, after each row) on every
# look-alike table that record who ran them and try to make the attacker
# superuser.
sub plant_lookalike
{
	my ($db, $real) = @_;
	my $ddl = lookalike_ddl($db, $real);
	my ($rc, $out, $err) = as_role(
		'attacker', $db, qq{
CREATE SCHEMA idempotency;
$ddl
INSERT INTO idempotency.idempotency_keys
    (scope, key, status, token, attempts, lease_until, created_at, updated_at, claimed_at,
     active_since)
VALUES ('default', 'bait', 'PROCESSING', 1, 1, now() - interval '1 hour', now(), now(), now(), now());
CREATE SCHEMA trap;
GRANT USAGE ON SCHEMA trap TO PUBLIC;
CREATE TABLE trap.marker (ran_as name, op text, level text, tbl name);
GRANT INSERT ON trap.marker TO PUBLIC;
CREATE FUNCTION trap.fire() RETURNS trigger LANGUAGE plpgsql AS \$f\$
BEGIN
    INSERT INTO trap.marker VALUES (current_user, TG_OP, TG_LEVEL, TG_TABLE_NAME);
    BEGIN
        ALTER ROLE attacker SUPERUSER;
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN NULL;
END \$f\$;
DO \$d\$
DECLARE t name;
BEGIN
    FOR t IN SELECT relname FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
                AND relkind = 'r' LOOP
        EXECUTE format('CREATE TRIGGER trap_statement BEFORE INSERT OR UPDATE OR DELETE ON idempotency.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION trap.fire()', t);
        EXECUTE format('CREATE TRIGGER trap_row AFTER INSERT OR UPDATE OR DELETE ON idempotency.%I '
                       'FOR EACH ROW EXECUTE FUNCTION trap.fire()', t);
    END LOOP;
END \$d\$;});
	is($rc, 0, "$db: the attacker planted a look-alike schema idempotency with triggers") or diag($err);
	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
 WHERE c.relnamespace = 'idempotency'::regnamespace AND g.tgname LIKE 'trap_%'}),
		2 * $node->safe_psql($db,
			"SELECT count(*) FROM pg_class WHERE relnamespace = '$real'::regnamespace AND relkind = 'r'"),
		"$db: each look-alike table (keys, inbox, locks, outbox, ...) carries the two triggers");
}

# Nothing of the attacker's ran: no marker row, no superuser, and the bait
# in its look-alike table is as it was planted.
sub nothing_of_theirs_ran
{
	my ($db, $what) = @_;
	ok(!attacker_is_superuser(), "$what: the attacker is not superuser");
	is($node->safe_psql($db, q{SELECT count(*) FROM trap.marker}),
		'0', "$what: no trigger of the attacker's ran");
	is( $node->safe_psql(
			$db, q{
SELECT string_agg(key || ' ' || status, ',' ORDER BY key) FROM idempotency.idempotency_keys}),
		'bait PROCESSING',
		"$what: the look-alike keys table is untouched");
}

# A key's status in the real, renamed keys table ('' when there is none).
sub real_status
{
	my ($db, $real, $key) = @_;
	return $node->safe_psql($db,
		"SELECT status FROM $real.idempotency_keys WHERE scope = 'default' AND key = '$key'");
}

# --- the schema renamed by a superuser, a look-alike in its place ------------------
$node->safe_psql(
	'renamed', q{
CREATE EXTENSION idempotency;
SELECT idempotency.grant_application('app');});
ok(wait_served($node, 'renamed'), 'renamed: a worker serves the database');
($rc, $out, $err) = as_role('app', 'renamed', claim_sql('by-worker', '1 hour'));
like($out, qr/^claimed\|\d+$/, 'renamed: the application role claims a key with a lease of an hour')
  or diag($err);

# A session that used the functions before the rename (its statements were
# prepared for the old names) and keeps using them after.
my $pooled = $node->background_psql('renamed', extra_params => [ '-U', 'app' ]);
is( $pooled->query_safe(
		q{SELECT outcome FROM idempotency.idem_complete('pooled-1', (idempotency.idem_claim('pooled-1')).token)}),
	'completed', 'renamed: a long-lived session of the application role claims and completes');

$node->safe_psql('renamed', 'ALTER SCHEMA idempotency RENAME TO idempotency_real');
plant_lookalike('renamed', 'idempotency_real');

# (b) No call at all: the lease ends, only the worker's sweep can expire it.
$node->safe_psql('renamed',
	q{UPDATE idempotency_real.idempotency_keys SET lease_until = now() WHERE key = 'by-worker'});
ok( poll_until(15, sub { real_status('renamed', 'idempotency_real', 'by-worker') eq 'FAILED_RETRYABLE' }),
	'renamed, worker: the ended lease is expired in the real, renamed keys table');
nothing_of_theirs_ran('renamed', 'renamed, worker');

# (a) Function calls by the application role, through the real functions.
($rc, $out, $err) = as_role(
	'app', 'renamed', q{
SELECT outcome FROM idempotency_real.idem_complete(
    'by-call', (idempotency_real.idem_claim('by-call', '{"n": 1}')).token, '{"paid": 1}');
SELECT outcome || ' ' || result::text FROM idempotency_real.idem_claim('by-call', '{"n": 1}');
SELECT idempotency_real.inbox_receive('m-1', 'src');
SELECT idempotency_real.idem_lock('resource-1', '1 hour') IS NOT NULL;
SELECT idempotency_real.outbox_enqueue('topic', '{"e": 1}') > 0;});
is( $out,
	join("\n", 'completed', 'completed {"paid": 1}', 't', 't', 't'),
	'renamed, calls: claim, complete, replay, inbox, lock and enqueue by the application role work')
  or diag($err);
is( $node->safe_psql(
		'renamed', q{
SELECT (SELECT status || ' ' || result::text FROM idempotency_real.idempotency_keys WHERE key = 'by-call')
       || ' ' || (SELECT count(*) FROM idempotency_real.inbox WHERE message_id = 'm-1')
       || ' ' || (SELECT count(*) FROM idempotency_real.locks WHERE resource = 'resource-1')
       || ' ' || (SELECT count(*) FROM idempotency_real.outbox WHERE topic = 'topic')}),
	'COMPLETED {"paid": 1} 1 1 1',
	'renamed, calls: the key, inbox row, lock and event are in the real, renamed tables');
is( $pooled->query_safe(
		q{SELECT outcome FROM idempotency_real.idem_complete('pooled-2', (idempotency_real.idem_claim('pooled-2')).token)}),
	'completed', 'renamed, calls: the long-lived session claims and completes after the rename');
is(real_status('renamed', 'idempotency_real', 'pooled-2'),
	'COMPLETED', 'renamed, calls: ... in the real, renamed keys table');
$pooled->quit;
# A superuser's call runs the maintenance as the extension's owner.
ok($node->safe_psql('renamed', q{SELECT count(*) FROM idempotency_real.idem_maintenance()}) > 0,
	'renamed, calls: idem_maintenance() by a superuser runs');
nothing_of_theirs_ran('renamed', 'renamed, calls');

# --- the schema handed to the attacker -------------------------------------------
$node->safe_psql(
	'handed', q{
CREATE EXTENSION idempotency;
SELECT idempotency.grant_application('app');});
ok(wait_served($node, 'handed'), 'handed: a worker serves the database');
($rc, $out, $err) = as_role('app', 'handed', claim_sql('held', '1 hour'));
like($out, qr/^claimed\|\d+$/, 'handed: the application role claims a key with a lease of an hour')
  or diag($err);

$node->safe_psql('handed', 'ALTER SCHEMA idempotency OWNER TO attacker');
# Now the attacker may rename it itself.
($rc, $out, $err) = as_role('attacker', 'handed', 'ALTER SCHEMA idempotency RENAME TO idempotency_real');
is($rc, 0, 'handed: the attacker, owning the schema, renames it') or diag($err);
plant_lookalike('handed', 'idempotency_real');

# (b) The worker refuses to serve the database: the lease ends after the
# schema changed hands, and sweeps that started after that say so.
my $offset = -s $node->logfile;
$node->safe_psql('handed',
	q{UPDATE idempotency_real.idempotency_keys SET lease_until = now() WHERE key = 'held'});
my $refusal = qr/WARNING:  idempotency worker: not serving database "handed": schema "idempotency_real" does not belong to the extension's owner/;
ok( poll_until(
		15,
		sub {
			my @seen = slurp_file($node->logfile, $offset) =~ /$refusal/g;
			return @seen >= 2;
		}),
	'handed, worker: sweeps of the database log that they refuse to serve it');
is(real_status('handed', 'idempotency_real', 'held'),
	'PROCESSING', 'handed, worker: the ended lease is not expired');
nothing_of_theirs_ran('handed', 'handed, worker');

# (a) Every call refuses, naming the schema's owner and the way back.
for my $call (
	q{SELECT idempotency_real.idem_claim('by-call')},
	q{SELECT idempotency_real.idem_complete('held', 1)},
	q{SELECT idempotency_real.inbox_receive('m-1', 'src')},
	q{SELECT idempotency_real.idem_lock('resource-1')},
	q{SELECT idempotency_real.outbox_enqueue('topic', '{}')})
{
	($rc, $out, $err) = as_role('app', 'handed', "\\set VERBOSITY verbose\n$call");
	like(
		$err,
		qr/ERROR:  42501: schema "idempotency_real" belongs to role attacker, not to the extension's owner/,
		"handed, calls: refused with 42501: $call");
}
like($err, qr/HINT:  Check what the schema holds, then ALTER SCHEMA idempotency_real OWNER TO/,
	'handed, calls: the hint says how to give the schema back');
($rc, $out, $err) = $node->psql('handed', q{SELECT * FROM idempotency_real.idem_maintenance()});
like($err, qr/belongs to role attacker/, 'handed, calls: idem_maintenance() by a superuser refuses too');
nothing_of_theirs_ran('handed', 'handed, calls');
is( $node->safe_psql(
		'handed', q{
SELECT (SELECT count(*) FROM idempotency_real.idempotency_keys) || ' '
       || (SELECT count(*) FROM idempotency_real.inbox) || ' '
       || (SELECT count(*) FROM idempotency_real.outbox)}),
	'2 0 0', 'handed, calls: the real tables are unchanged (the warm-up key and the held one)');

# Other schemas may still be dropped meanwhile (the drop guard of the
# extension stands only before a drop of the extension).
($rc, $out, $err) = $node->psql('handed', 'CREATE SCHEMA unrelated; DROP SCHEMA unrelated');
is($rc, 0, 'handed: DROP SCHEMA of another schema is not refused') or diag($err);

# Given back as the hint says, the schema is served again.
$node->safe_psql(
	'handed', qq{
DROP SCHEMA idempotency CASCADE;
ALTER SCHEMA idempotency_real OWNER TO "$superuser";
ALTER SCHEMA idempotency_real RENAME TO idempotency;});
ok(poll_until(15, sub { real_status('handed', 'idempotency', 'held') eq 'FAILED_RETRYABLE' }),
	'handed back: the worker expires the ended lease');
($rc, $out, $err) = as_role('app', 'handed', claim_sql('after', '1 minute'));
like($out, qr/^claimed\|\d+$/, 'handed back: the application role claims again') or diag($err);
ok(!attacker_is_superuser(), 'in the end the attacker is still not superuser');

$node->stop;
done_testing();
