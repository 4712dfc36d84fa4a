# pg_cron runs the SQL edition's housekeeping (docs/managed-postgres.md,
# "Install on a managed service, step by step"), followed as a user of a
# managed service follows it.
#
# The provider's part: a cluster with pg_cron preloaded and
# cron.database_name set, and neither our library nor any of its settings.
# The administrator's part: the database, the owner role (no superuser) and
# its schema, pg_cron created in the database, USAGE on schema cron for the
# owner. The owner's part: the plain script, the rights, and the schedule
# (a cron line, every minute: pg_cron 1.4 takes no seconds). Then pg_cron,
# and nobody else, runs idem_maintenance() at the next minute: a lease that
# ended is expired, a finished key is settled, a finished key past its
# retention leaves its tombstone, and cron.job_run_details records the run
# as succeeded. The steps the doc names as needed are shown to be needed:
# without USAGE on schema cron the owner cannot schedule, and
# cron.schedule_in_database is the administrator's to grant.
#
# pg_cron must be installed for the PostgreSQL under test (Debian's
# postgresql-15-cron, which `make test` installs). Where it is not, the
# test skips and says why, unless IDEM_REQUIRE_THIRD_PARTY is set (test/run.sh
# sets it where `make test` installs the package): then it fails.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

needs_extension('pg_cron', 'postgresql-15-cron');

my $root = $ENV{TESTDIR} // "$FindBin::RealBin/../..";
my $dir = PostgreSQL::Test::Utils::tempdir;

# The provider's settings. The cluster takes connections on a Unix socket
# only, so pg_cron runs its jobs in background workers rather than through
# a connection to localhost.
my $node = PostgreSQL::Test::Cluster->new('sql_edition_pg_cron');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'app'
cron.use_background_workers = on
});
$node->start;

# Step 1: the plain script.
open(my $control, '<', "$root/idempotency.control") or die "idempotency.control: $!";
my ($version) = map { /^default_version = '(.*)'/ ? $1 : () } <$control>;
close($control);
system('bash', "$root/src/sql_edition/build.sh", $version, $dir) == 0
  or BAIL_OUT('the SQL edition does not build');

sub as
{
	my ($role, $sql) = @_;
	return $node->safe_psql('app', $sql, extra_params => [ '-U', $role ]);
}

sub fails_as
{
	my ($role, $sql, $error, $name) = @_;
	my ($rc, $out, $err) = $node->psql('app', $sql, extra_params => [ '-U', $role ]);
	ok($rc != 0 && $err =~ $error, $name) or diag("exit $rc: $err");
}

# Step 2, as the administrator: the owner and its schema.
$node->safe_psql('postgres', q{
CREATE DATABASE app;
CREATE ROLE idem_owner LOGIN;
CREATE ROLE app LOGIN;});
$node->safe_psql('app', 'CREATE SCHEMA idempotency AUTHORIZATION idem_owner');
is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'idem_owner'}),
	'f', 'the owner is no superuser');

# Step 3, as the owner: the plain script.
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-U', 'idem_owner',
		'-f', "$dir/idempotency-sql--$version.sql" ],
	'the plain script installs as the owner');

# Step 4, as the owner: the application's rights.
as('idem_owner', q{SELECT idempotency.grant_application('app')});

# Work for the sweeps, as the application: a claim whose lease ends at
# once, a finished key (kept a day: to be settled), and a finished key
# whose result is kept for no time (to leave its tombstone; its complete
# filed it for retention, and so settled it, at once).
as('app', q{
SELECT outcome FROM idempotency.idem_claim('k-lease', lease => '1 millisecond');
SELECT outcome FROM idempotency.idem_complete('k-kept',
    (SELECT token FROM idempotency.idem_claim('k-kept')), '{"charge": 1}');
SELECT outcome FROM idempotency.idem_complete('k-gone',
    (SELECT token FROM idempotency.idem_claim('k-gone')), '{"charge": 2}', retain => '0');});
poll_until(10, sub {
	as('app', q{SELECT lease_until <= clock_timestamp() FROM idempotency.idem_get('k-lease')}) eq 't';
}) or BAIL_OUT('the lease of one millisecond did not end');

my $keys = q{
SELECT string_agg(key || ':' || status || ':' || (active_since IS NOT NULL), ' ' ORDER BY key)
  FROM idempotency.idempotency_keys};
is(as('idem_owner', $keys), 'k-gone:COMPLETED:false k-kept:COMPLETED:true k-lease:PROCESSING:true',
	'before: the lease is held, the finished key kept a day is live');
is(as('idem_owner', q{SELECT string_agg(key, ' ') FROM idempotency.idem_stuck}),
	'k-lease', 'before: idem_stuck shows the ended lease');
is(as('idem_owner', q{SELECT processing || ' ' || stuck FROM idempotency.idem_stats WHERE scope = 'default'}),
	'1 1', 'before: idem_stats counts the lease as processing and stuck');

# Step 5, the administrator's part: pg_cron in the database, and USAGE on
# its schema for the owner. Without that USAGE the owner cannot schedule.
$node->safe_psql('app', 'CREATE EXTENSION pg_cron');
my $cron_version = $node->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'});
diag("pg_cron $cron_version");
fails_as('idem_owner',
	q{SELECT cron.schedule('idempotency-maintenance', '* * * * *', 'SELECT * FROM idempotency.idem_maintenance()')},
	qr/permission denied for schema cron/, 'without USAGE on schema cron the owner cannot schedule');
$node->safe_psql('app', 'GRANT USAGE ON SCHEMA cron TO idem_owner');
fails_as('idem_owner',
	q{SELECT cron.schedule_in_database('other', '* * * * *', 'SELECT 1', 'postgres')},
	qr/permission denied for function schedule_in_database/,
	'cron.schedule_in_database needs a grant of the administrator');

# Step 5, the owner's part: the schedule. pg_cron before 1.5 refuses
# seconds; a cron line runs every minute.
my ($major, $minor) = $cron_version =~ /^(\d+)\.(\d+)/ or die "pg_cron version $cron_version";
if ($major == 1 && $minor < 5)
{
	fails_as('idem_owner',
		q{SELECT cron.schedule('idempotency-maintenance', '5 seconds', 'SELECT * FROM idempotency.idem_maintenance()')},
		qr/invalid schedule/, "pg_cron $cron_version refuses a schedule in seconds");
}
my $job = as('idem_owner',
	q{SELECT cron.schedule('idempotency-maintenance', '* * * * *', 'SELECT * FROM idempotency.idem_maintenance()')});
like($job, qr/^\d+$/, 'the owner schedules idem_maintenance() every minute');

# The first minute boundary runs the job: wait for its run to end (up to
# two and a half minutes; a schedule of a minute takes up to one).
my $run = q{
SELECT status || ' ' || username || ' ' || return_message FROM cron.job_run_details
 WHERE jobid = } . $job . q{ AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1};
my $waited = poll_until(150, sub { as('idem_owner', $run) ne '' }, 1000);
ok(defined $waited, 'pg_cron ran the job') or BAIL_OUT('pg_cron did not run the job within 150 s');
diag(sprintf('pg_cron ran the job after %.0f s', $waited));
like(as('idem_owner', $run), qr/^succeeded idem_owner SELECT \d+$/,
	'cron.job_run_details records the run as succeeded, as the owner');

# What the run did, through the functions and the views.
is(as('app', q{SELECT status || ' ' || last_error || ' ' || (active_since IS NULL)
                 FROM idempotency.idem_get('k-lease')}),
	'FAILED_RETRYABLE lease expired true', 'the ended lease is expired (idem_get)');
is(as('app', q{SELECT status || ' ' || (active_since IS NULL) || ' ' || (result IS NOT NULL)
                 FROM idempotency.idem_get('k-kept')}),
	'COMPLETED true true', 'the finished key is settled and keeps its result (idem_get)');
is(as('app', q{SELECT status || ' ' || result_expired FROM idempotency.idem_get('k-gone')}),
	'COMPLETED true', 'the finished key past its retention left its tombstone (idem_get)');
is(as('idem_owner', $keys), 'k-kept:COMPLETED:false k-lease:FAILED_RETRYABLE:false',
	'after: no live key is left');
is(as('idem_owner', q{SELECT count(*) FROM idempotency.idem_stuck}), '0',
	'after: idem_stuck is empty');
is(as('idem_owner', q{SELECT count(*) FROM idempotency.key_tombstones}), '1',
	'after: one tombstone');
is(as('idem_owner', q{SELECT processing || ' ' || stuck || ' ' || failed_retryable
                        FROM idempotency.idem_stats WHERE scope = 'default'}),
	'0 0 1', 'after: idem_stats counts no key processing or stuck, one to retry');

$node->stop;
done_testing();
