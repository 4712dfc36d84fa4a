# Idle costs nothing: with the extension in 50 databases where nothing
# happens, no worker starts in any of them (counted from the launcher's
# debug lines, one per worker it starts, and by sampling pg_stat_activity);
# then a lease that ends in one database is expired within about a naptime,
# and only that database gets a worker.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use List::Util qw(min);
use Time::HiRes qw(time usleep);

my $databases = 50;
my $naptime = 0.2;    # seconds, as idem_node sets it
my $node = idem_node('idle', conf => ["log_min_messages = debug1"]);

my $t_setup = time;
for my $i (1 .. $databases)
{
	$node->safe_psql('postgres', "CREATE DATABASE idle_$i");
	$node->safe_psql("idle_$i", 'CREATE EXTENSION idempotency');
}
note(sprintf('%d databases with the extension created in %.1f s', $databases, time - $t_setup));
my %name_of = map { split /\|/ } split /\n/,
  $node->safe_psql('postgres', "SELECT oid, datname FROM pg_database WHERE datname LIKE 'idle_%'");
is(scalar(keys %name_of), $databases, "$databases databases");

# The workers the launcher started since log offset OFFSET, by database name.
sub starts_since
{
	my ($offset) = @_;
	my %starts;
	my $log = slurp_file($node->logfile, $offset);
	$starts{ $name_of{$1} // "oid $1" }++
	  while $log =~ /idempotency launcher: worker for database (\d+): /g;
	return \%starts;
}

# Pids of idempotency workers seen in pg_stat_activity over SECONDS, as
# "datname:pid" lines (a worker lives for milliseconds: sampled server-side).
sub sampled_workers
{
	my ($seconds) = @_;
	my ($rc, $out, $err) = $node->psql(
		'postgres', qq{
DO \$\$
DECLARE
  seen text[] := '{}';
  deadline timestamptz := clock_timestamp() + make_interval(secs => $seconds);
BEGIN
  WHILE clock_timestamp() < deadline LOOP
    PERFORM pg_stat_clear_snapshot();
    SELECT seen || array_agg(datname || ':' || pid) INTO seen FROM pg_stat_activity
     WHERE backend_type = 'idempotency worker' AND NOT (datname || ':' || pid) = ANY (seen);
    PERFORM pg_sleep(0.005);
  END LOOP;
  RAISE NOTICE 'seen=%', array_to_string(seen, ',');
END \$\$});
	return $err =~ /seen=([^\n]*)/ ? [ grep { $_ ne '' } split /,/, $1 ] : undef;
}

# --- the setup's own work settles ---------------------------------------------
# Each new database is swept once, and so is each one after CREATE EXTENSION
# wrote its catalogs; then nothing is due anywhere.
# Quiet: 3 s (15 naptimes) without a worker started.
my $offset = -s $node->logfile;
my $quiet = 0;
for (my $deadline = time + 90; !$quiet && time < $deadline;)
{
	sleep(3);
	my $size = -s $node->logfile;
	$quiet = !%{ starts_since($offset) };
	$offset = $size;
}
ok($quiet, 'the sweeps that follow the setup end');

# --- idle: no worker anywhere -----------------------------------------------------
$offset = -s $node->logfile;
my $sampled = sampled_workers(10);
my $idle_starts = starts_since($offset);
ok(defined $sampled, 'pg_stat_activity sampled for 10 s');
is(scalar(@{ $sampled // [] }), 0, 'no idempotency worker seen in 10 s (50 naptimes)')
  or diag(join(', ', @{$sampled}));
is_deeply($idle_starts, {}, 'the launcher started no worker in 10 s')
  or diag(explain($idle_starts));

# --- a lease ends in one database ---------------------------------------------------
my $db = "idle_$databases";
$offset = -s $node->logfile;
my @lease_sampled;
my @delays = on_time_tries(
	$naptime + 1,
	sub {
		lease_expiry_delay($node, $db, "ends-$_[0]", 5,
			sub { push @lease_sampled, @{ sampled_workers(3) // [] } });
	});
ok(defined $delays[0], "$db: the lease was expired");
diag(sprintf('lease end -> expiry with %d idle databases: %s (naptime 200ms)',
		$databases, join(', ', map { fmt_ms($_ // 99) } @delays)));
cmp_ok(min(map { $_ // 99 } @delays), '>=', 0, 'not before the lease ended');
cmp_ok($delays[-1] // 99, '<', $naptime + 1, 'within about a naptime of its end (one of three tries)');

my $lease_starts = starts_since($offset);
ok(($lease_starts->{$db} // 0) >= 1, "$db got a worker");
is_deeply([ grep { $_ ne $db } sort keys %$lease_starts ], [], 'no other database got one')
  or diag(explain($lease_starts));
my %sampled_dbs = map { (split /:/)[0] => 1 } @lease_sampled;
is_deeply([ grep { $_ ne $db } sort keys %sampled_dbs ],
	[], 'pg_stat_activity showed workers in no other database');

# A lease ended by a write behind the functions: idempotency.request_sweep()
# has the database swept at once (no due time says so).
my $other = 'idle_2';
like($node->safe_psql($other, claim_sql('behind', '1 hour')), qr/^claimed/, "$other: a 1 h lease claimed");
$node->safe_psql($other,
	q{UPDATE idempotency.idempotency_keys SET lease_until = now() - interval '1 second' WHERE key = 'behind'});
$offset = -s $node->logfile;
$node->safe_psql($other, 'SELECT idempotency.request_sweep()');
ok( poll_until(
		5,
		sub {
			my $row = key_row($node, $other, 'behind');
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		}),
	"$other: request_sweep() had the lease written behind the functions expired");
# The launcher logs a start just after it asked for the worker, which can
# run and commit before that line is written: waited for, not read once.
ok(poll_until(10, sub { (starts_since($offset)->{$other} // 0) >= 1 }),
	"$other: the sweep was a worker of its own");

my $log = slurp_file($node->logfile);
unlike($log, qr/background worker "idempotency \w+" \(PID \d+\) exited with exit code [1-9]/,
	'no worker or launcher error logged');
$node->stop;
done_testing();
