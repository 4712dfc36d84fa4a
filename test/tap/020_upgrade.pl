# Upgrades: every older version of the extension that has an update path to
# the current default is installed, used, and updated with ALTER EXTENSION
# ... UPDATE; its data must survive, the background workers must run against
# the older schema without errors before the update, and afterwards its
# catalog must be the same as a fresh install of the default version (which
# runs that version's own full script; 030_install_script.pl compares the
# two ways in more detail, without data). What 0.4.0 changes for an
# existing install is checked on its own: the rights of a role that had
# USAGE, a lease of a key claimed before the update, and the update refusing
# a schema of another role or one holding objects of others.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('upgrade');
my $dump_dir = PostgreSQL::Test::Utils::tempdir;
$node->safe_psql('postgres', 'CREATE ROLE old_app LOGIN');
$node->safe_psql('postgres', 'CREATE ROLE old_monitor LOGIN');

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
UNION ALL
SELECT 'dumped ' || c::regclass || ' ' || coalesce(f, '')
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(c, f)
 WHERE e.extname = 'idempotency'
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
like($fresh, qr/^dumped idempotency\.idempotency_keys $/m, '... and the tables pg_dump writes the rows of');

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
	# A key whose lease ends after the update, and a role that had what the
	# old version asked for: USAGE on the schema before 0.4.0, the rights of
	# grant_application since.
	my $had_grants = $version ge '0.4.0';
	$node->safe_psql($db,
		"SELECT idempotency.idem_claim('order-4', NULL, '1 hour')");
	$node->safe_psql($db, $had_grants
		? "SELECT idempotency.grant_application('old_app')"
		: "GRANT USAGE ON SCHEMA idempotency TO old_app");
	$node->safe_psql($db, "SELECT idempotency.grant_monitoring('old_monitor')") if $had_grants;
	my ($rc, $out, $err) = $node->psql($db, "SELECT outcome FROM idempotency.idem_claim('by-old-app')",
		extra_params => [ '-U', 'old_app' ]);
	is($out, 'claimed', "$version: the application role claims before the update") or diag($err);
	# A lease that runs out: the workers must expire it on the old schema.
	$node->safe_psql($db,
		"SELECT idempotency.idem_claim('order-3', NULL, '100 milliseconds')");
	ok( poll_until(10, sub {
				$node->safe_psql($db,
					"SELECT status FROM idempotency.idempotency_keys WHERE key = 'order-3'")
				  eq 'FAILED_RETRYABLE';
			}),
		"$version: the workers expire leases before the update");
	# The outbox at the old version, served by this library: one key's
	# events in order, the first left in flight across the update.
	my $has_outbox = $node->safe_psql($db,
		"SELECT to_regclass('idempotency.outbox') IS NOT NULL") eq 't';
	if ($has_outbox)
	{
		$node->safe_psql($db,
			"SELECT idempotency.outbox_enqueue('up', jsonb_build_object('n', n), 'k') FROM generate_series(1, 3) n");
		is($node->safe_psql($db,
				"SELECT string_agg(payload->>'n', ',') FROM idempotency.outbox_claim('r', 10, '1 hour', '{up}')"),
			'1', "$version: the old outbox hands out a key's first event only");
	}
	my $tasks = $node->safe_psql($db,
		'SELECT string_agg(task, \',\' ORDER BY task) FROM idempotency.idem_maintenance()');
	unlike($tasks, qr/outbox/, "$version: idem_maintenance skips tasks of objects it lacks")
	  if $version eq '0.1.0';

	$node->safe_psql($db, 'ALTER EXTENSION idempotency UPDATE');
	if ($had_grants)
	{
		# Its rights survive the update; taken back, it is refused.
		($rc, $out, $err) = $node->psql($db, "SELECT outcome FROM idempotency.idem_claim('by-old-app-1')",
			extra_params => [ '-U', 'old_app' ]);
		is($out, 'claimed', "$version: after the update the application role still claims") or diag($err);
		# idem_complete and idem_fail were made anew in 0.7.0 (retain_key):
		# the role executes the new ones.
		($rc, $out, $err) = $node->psql($db, q{
SELECT (idempotency.idem_complete('by-old-app-4', (SELECT token FROM idempotency.idem_claim('by-old-app-4')),
                                  retain_key => '1 day')).outcome,
       idempotency.idem_fail('by-old-app-3', (idempotency.idem_claim('by-old-app-3')).token, 'no', false,
                             retain => '0', retain_key => '1 day')},
			extra_params => [ '-U', 'old_app' ]);
		is($out, 'completed|FAILED_FINAL', "$version: ... and completes and fails with the new functions") or diag($err);
		# A dump of the updated database keeps those rights: given by the
		# update, they are the roles', which pg_dump writes, not the
		# extension's initial ones, which it leaves out.
		my $restored = "${db}_restored";
		command_ok([ 'pg_dump', '-d', $node->connstr($db), '-Fc', '-f', "$dump_dir/$db.dump" ],
			"$version: pg_dump -Fc of the updated database");
		$node->safe_psql('postgres', "CREATE DATABASE $restored");
		command_ok([ 'pg_restore', '-d', $node->connstr($restored), '--exit-on-error', "$dump_dir/$db.dump" ],
			"$version: ... restored into an empty database");
		($rc, $out, $err) = $node->psql($restored, q{
SELECT (idempotency.idem_complete('restored-1', (SELECT token FROM idempotency.idem_claim('restored-1')))).outcome,
       idempotency.idem_fail('restored-2', (idempotency.idem_claim('restored-2')).token, 'no', false)},
			extra_params => [ '-U', 'old_app' ]);
		is($out, 'completed|FAILED_FINAL', "$version: ... where the application role completes and fails")
		  or diag($err);
		($rc, $out, $err) = $node->psql($restored, q{
SELECT bytes > 0 FROM idempotency.idem_tombstones;
SELECT count(*) >= 0 FROM idempotency.idem_metrics;
SELECT count(*) >= 0 FROM idempotency.idem_stats;
SELECT count(*) >= 0 FROM idempotency.outbox_lag},
			extra_params => [ '-U', 'old_monitor' ]);
		is($out, "t\nt\nt\nt", "$version: ... and the monitoring role reads the views") or diag($err);
		$node->safe_psql($db, "SELECT idempotency.revoke_role('old_app')");
		$node->safe_psql($db, "GRANT USAGE ON SCHEMA idempotency TO old_app");
		# A monitoring role still reads the views, and how their counts
		# were had (the functions behind them were made anew in 0.7.0).
		# The update has the worker recount the database: while it counts,
		# a read says 'unknown' (NULL), so the role reads until it is done.
		ok( poll_until(30, sub {
					($rc, $out, $err) = $node->psql($db,
						"SELECT string_agg(DISTINCT coalesce(counted_by, 'unknown'), ',') FROM idempotency.idem_stats",
						extra_params => [ '-U', 'old_monitor' ]);
					$out eq 'commits';
				}),
			"$version: after the update the monitoring role reads idem_stats")
		  or diag("counted_by: $out $err");
		($rc, $out, $err) = $node->psql($db,
			"SELECT count(*) >= 0 FROM idempotency.outbox_lag WHERE counted_by = 'commits'",
			extra_params => [ '-U', 'old_monitor' ]);
		is($out, 't', "$version: ... and outbox_lag") or diag($err);
		($rc, $out, $err) = $node->psql($db, "SELECT bytes > 0 FROM idempotency.idem_tombstones",
			extra_params => [ '-U', 'old_monitor' ]);
		is($out, 't', "$version: ... and idem_tombstones, new in 0.7.0") or diag($err);
		$node->safe_psql($db, "SELECT idempotency.revoke_role('old_monitor')");
	}
	# Since 0.4.0 no function is executable by PUBLIC: USAGE is not enough,
	# the role is given its rights with grant_application (below, once the
	# catalog is compared).
	($rc, $out, $err) = $node->psql($db, "SELECT outcome FROM idempotency.idem_claim('by-old-app-2')",
		extra_params => [ '-U', 'old_app' ]);
	like($err, qr/permission denied for function idem_claim/,
		"$version: after the update USAGE alone no longer lets a role claim");
	$node->safe_psql($db, "REVOKE USAGE ON SCHEMA idempotency FROM old_app");
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
	if ($has_outbox)
	{
		# The event in flight is its key's head: the next waits for its ack.
		my $claim = "SELECT coalesce(string_agg(payload->>'n', ','), 'none') FROM idempotency.outbox_claim('r', 10, '1 hour', '{up}')";
		my $ack = "SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox WHERE topic = 'up' AND state = 'in_flight'))";
		is($node->safe_psql($db, $claim), 'none', "$version: after the update, the key waits behind its event in flight");
		$node->safe_psql($db, $ack);
		is($node->safe_psql($db, $claim), '2', "$version: after its ack, the next event");
		$node->safe_psql($db, $ack);
		is($node->safe_psql($db, $claim), '3', "$version: then the last one");
	}
	is($node->safe_psql($db, $describe), $fresh,
		"$version: the updated catalog equals a fresh install of $default");

	# What the older version left PROCESSING (no attempt cap recorded) is
	# expired by the workers with the server's settings.
	$node->safe_psql($db,
		"UPDATE idempotency.idempotency_keys SET lease_until = now() WHERE key = 'order-4'");
	ok( poll_until(10, sub {
				$node->safe_psql($db,
					"SELECT status FROM idempotency.idempotency_keys WHERE key = 'order-4'")
				  eq 'FAILED_RETRYABLE';
			}),
		"$version: the workers expire a lease of a key claimed before the update");

	$node->safe_psql($db, "SELECT idempotency.grant_application('old_app')");
	($rc, $out, $err) = $node->psql($db, "SELECT outcome FROM idempotency.idem_claim('by-old-app-2')",
		extra_params => [ '-U', 'old_app' ]);
	is($out, 'claimed', "$version: ... grant_application does") or diag($err);
}

# No error but the refused calls of old_app after the update.
my @errors = grep { !/ERROR:  permission denied for function idem_claim/ }
  slurp_file($node->logfile) =~ /^.*(?:ERROR|FATAL):  .*$/mg;
is_deeply(\@errors, [], 'no other error in the server log');

# --- an install the update to 0.4.0 refuses ----------------------------------------
# A schema that another role created before the install (the old versions
# reused it), or one that holds objects of others: the update stops with the
# way out in its hint, and goes through once the schema is put right.
$node->safe_psql('postgres', 'CREATE DATABASE foreign_schema OWNER old_app');
$node->safe_psql('foreign_schema', 'CREATE SCHEMA idempotency', extra_params => [ '-U', 'old_app' ]);
$node->safe_psql('foreign_schema', "CREATE EXTENSION idempotency VERSION '0.3.0'");
my ($rc, $out, $err) = $node->psql('foreign_schema', "ALTER EXTENSION idempotency UPDATE TO '0.4.0'");
like($err, qr/schema idempotency belongs to role old_app, not to the extension's owner/,
	'0.3.0 in a schema of another role: the update is refused');
like($err, qr/HINT:  .*ALTER SCHEMA idempotency OWNER TO/, '... and the hint says how to go on');
my $superuser = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('foreign_schema', qq{ALTER SCHEMA idempotency OWNER TO "$superuser";
ALTER EXTENSION idempotency UPDATE TO '0.4.0'});
is($node->safe_psql('foreign_schema', "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'0.4.0', '... once the schema is the owner\'s, the update goes through');

$node->safe_psql('postgres', 'CREATE DATABASE stranger');
$node->safe_psql('stranger', "CREATE EXTENSION idempotency VERSION '0.3.0'; CREATE TABLE idempotency.notes (x int)");
($rc, $out, $err) = $node->psql('stranger', "ALTER EXTENSION idempotency UPDATE TO '0.4.0'");
like($err, qr/schema idempotency holds objects that are not the extension's: table (idempotency\.)?notes/,
	'0.3.0 with a table of the user in its schema: the update is refused, naming it');
$node->safe_psql('stranger', "ALTER TABLE idempotency.notes SET SCHEMA public;
ALTER EXTENSION idempotency UPDATE TO '0.4.0'");
is($node->safe_psql('stranger', "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'0.4.0', '... once it is moved out, the update goes through');

done_testing();
