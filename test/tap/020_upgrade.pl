# Upgrades: every older version of the extension that has an update path to
# the current default is installed, used, and updated with ALTER EXTENSION
# ... UPDATE; its data must survive, the background workers must run against
# the older schema without errors before the update, and afterwards its
# catalog must be the same as a fresh install of the default version.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('upgrade');

# Everything the extension owns, described so that two installs compare
# equal exactly when their objects, definitions and privileges are equal.
my $describe = <<'SQL';
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'idempotency'),
members AS (
    SELECT d.classid, d.objid
      FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
       AND d.deptype = 'e')
SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT 'function ' || p.oid::regprocedure || ' returns ' || pg_get_function_result(p.oid)
       || ' definer=' || p.prosecdef || ' volatile=' || p.provolatile::text
       || ' strict=' || p.proisstrict || ' config=' || coalesce(p.proconfig::text, '')
       || ' acl=' || coalesce(p.proacl::text, 'default')
       || ' args=' || pg_get_function_arguments(p.oid)
  FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT 'relation ' || c.oid::regclass || ' kind=' || c.relkind::text
       || ' options=' || coalesce(c.reloptions::text, '')
       || ' acl=' || coalesce(c.relacl::text, 'default')
  FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
UNION ALL
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' '
       || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
       || ' default=' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '')
       || ' identity=' || a.attidentity::text || ' position=' || a.attnum
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE c.relnamespace = 'idempotency'::regnamespace
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace
UNION ALL
SELECT 'view ' || c.oid::regclass || ' ' || pg_get_viewdef(c.oid)
  FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'v'
UNION ALL
SELECT 'enum ' || enumtypid::regtype || ' ' || string_agg(enumlabel, ',' ORDER BY enumsortorder)
  FROM pg_enum WHERE enumtypid IN (SELECT oid FROM pg_type WHERE typnamespace = 'idempotency'::regnamespace)
 GROUP BY enumtypid
UNION ALL
SELECT 'schema acl ' || coalesce(nspacl::text, 'default')
  FROM pg_namespace WHERE nspname = 'idempotency'
ORDER BY 1
SQL

my $default = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'");
my @older = split /\n/, $node->safe_psql('postgres',
	"SELECT source FROM pg_extension_update_paths('idempotency') "
	  . "WHERE target = '$default' AND path IS NOT NULL AND source <> '$default' ORDER BY 1");
ok(scalar(@older) >= 1, "older versions with an update path to $default: @older");

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
my $fresh = $node->safe_psql('fresh', $describe);
like($fresh, qr/outbox_claim/, 'the description covers the objects of the default version');

foreach my $version (@older)
{
	my $db = "from_" . ($version =~ s/\W/_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION idempotency VERSION '$version'");

	# Use it at the old version: a completed key, a registered key, an
	# inbox row, a lock.
	my $token = $node->safe_psql($db,
		"SELECT token FROM idempotency.idem_claim('order-1', '{\"amount\": 5}')");
	$node->safe_psql($db,
		"SELECT idempotency.idem_complete('order-1', $token, '{\"charge\": 77}')");
	$node->safe_psql($db, "SELECT idempotency.idem_register('order-2', NULL, 'job-2')");
	$node->safe_psql($db, "SELECT idempotency.inbox_receive('m-1', 'orders')");
	$node->safe_psql($db, "SELECT idempotency.idem_lock('resource-1', '1 hour')");
	# A lease that runs out: the workers must expire it on the old schema.
	$node->safe_psql($db,
		"SELECT idempotency.idem_claim('order-3', NULL, '100 milliseconds')");
	ok( poll_until(10, sub {
				$node->safe_psql($db,
					"SELECT status FROM idempotency.idempotency_keys WHERE key = 'order-3'")
				  eq 'FAILED_RETRYABLE';
			}),
		"$version: the workers expire leases before the update");
	my $tasks = $node->safe_psql($db,
		'SELECT string_agg(task, \',\' ORDER BY task) FROM idempotency.idem_maintenance()');
	unlike($tasks, qr/outbox/, "$version: idem_maintenance skips tasks of objects it lacks")
	  if $version eq '0.1.0';

	$node->safe_psql($db, 'ALTER EXTENSION idempotency UPDATE');
	is($node->safe_psql($db,
			"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
		$default, "$version: updated to $default");
	is($node->safe_psql($db,
			"SELECT outcome || ' ' || result::text FROM idempotency.idem_claim('order-1', '{\"amount\": 5}')"),
		'completed {"charge": 77}', "$version: a completed key still replays its result");
	is($node->safe_psql($db,
			"SELECT outcome || ' ' || job_ref FROM idempotency.idem_register('order-2')"),
		'in_progress job-2', "$version: a registered key survives");
	is($node->safe_psql($db, "SELECT idempotency.inbox_receive('m-1', 'orders')"),
		'f', "$version: inbox rows survive");
	is($node->safe_psql($db, "SELECT idempotency.idem_lock('resource-1')"),
		'', "$version: a held lock survives");
	ok($node->safe_psql($db,
			"SELECT idempotency.outbox_enqueue('t', '{}') > 0"),
		"$version: the new objects work after the update");
	is($node->safe_psql($db, $describe), $fresh,
		"$version: the updated catalog equals a fresh install of $default");
}

my $log = slurp_file($node->logfile);
unlike($log, qr/ERROR:  |FATAL:  /, 'no error in the server log');

done_testing();
