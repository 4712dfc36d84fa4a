# Helpers shared by the TAP tests of the background workers: a cluster with
# the library preloaded and short naptimes, bounded polling, and queries that
# find the workers in pg_stat_activity. Every wait here has a deadline.
package IdemTap;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(idem_node poll_until wait_until_up backend_pid wait_for_backend
  key_row claim_sql wait_served percentile fmt_ms needs_extension on_time_tries
  lease_expiry_delay);

# idem_node(NAME, conf => [lines], allows_streaming => 0|1, start => 1)
# A cluster with shared_preload_libraries = 'idempotency', naptime 200ms,
# launcher_naptime 1s, purge_naptime 1s and restart_after_crash on (the
# test module turns it off; a kill -9 of any backend then leaves the cluster
# down).
sub idem_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => $opt{allows_streaming} // 0);
	my @conf = (
		"shared_preload_libraries = 'idempotency'",
		"idempotency.naptime = '200ms'",
		"idempotency.launcher_naptime = '1s'",
		"idempotency.purge_naptime = '1s'",
		"restart_after_crash = on",
		"log_min_messages = info",
		@{ $opt{conf} // [] });
	$node->append_conf('postgresql.conf', join("\n", @conf) . "\n");
	$node->start if $opt{start} // 1;
	return $node;
}

# poll_until(TIMEOUT_S, CODE[, INTERVAL_MS]): calls CODE until it returns a
# true value or TIMEOUT_S seconds have passed. Returns the elapsed seconds
# (true, even when 0, as "0E0"), or undef on timeout.
sub poll_until
{
	my ($timeout, $code, $interval_ms) = @_;
	$interval_ms //= 50;
	my $start = time;
	while (1)
	{
		if ($code->())
		{
			my $elapsed = time - $start;
			return $elapsed > 0 ? $elapsed : "0E0";
		}
		return undef if time - $start > $timeout;
		usleep($interval_ms * 1000);
	}
}

# needs_extension(LIBRARY, PACKAGE): skips the whole test, saying why, when
# another project's extension (LIBRARY.so) is not installed for the
# PostgreSQL under test; fails instead when IDEM_REQUIRE_THIRD_PARTY is set
# (test/run.sh sets it where `make test` installs PACKAGE).
sub needs_extension
{
	my ($library, $package) = @_;
	my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
	my $pkglibdir = `"$pg_config" --pkglibdir`;
	chomp $pkglibdir;
	return if -e "$pkglibdir/$library.so";
	my $why = "$library is not installed for this PostgreSQL (no $library.so in $pkglibdir)";
	BAIL_OUT("$why, and IDEM_REQUIRE_THIRD_PARTY says it must be: install $package")
	  if $ENV{IDEM_REQUIRE_THIRD_PARTY};
	diag("SKIPPED: $why");
	plan skip_all => $why;
}

# Waits until the cluster accepts connections again (after a crash restart).
sub wait_until_up
{
	my ($node, $timeout) = @_;
	return poll_until(
		$timeout // 60,
		sub {
			my ($rc, $out) = $node->psql('postgres', 'SELECT 1');
			return $rc == 0 && defined $out && $out eq '1';
		},
		100);
}

# The pid of a backend of that type (in that database when given), or ''.
# The query is a single statement, so it tolerates a cluster restarting.
sub backend_pid
{
	my ($node, $type, $dbname) = @_;
	my $where = "backend_type = '$type'";
	$where .= " AND datname = '$dbname'" if defined $dbname;
	my ($rc, $out) = $node->psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE $where ORDER BY backend_start LIMIT 1");
	return $rc == 0 && defined $out ? $out : '';
}

# Polls pg_stat_activity on the server side (a worker lives only for the
# milliseconds of a sweep, too short for a psql per probe): the pid of a
# backend of that type, or '' when none showed within TIMEOUT_S seconds.
sub wait_for_backend
{
	my ($node, $type, $dbname, $timeout) = @_;
	$timeout //= 10;
	my $db = defined $dbname ? "'$dbname'" : 'NULL';
	my ($rc, $out, $err) = $node->psql(
		'postgres', qq{
DO \$\$
DECLARE
  found int;
  deadline timestamptz := clock_timestamp() + make_interval(secs => $timeout);
BEGIN
  LOOP
    PERFORM pg_stat_clear_snapshot();
    SELECT pid INTO found FROM pg_stat_activity
     WHERE backend_type = '$type' AND ($db IS NULL OR datname = $db) LIMIT 1;
    EXIT WHEN found IS NOT NULL OR clock_timestamp() > deadline;
    PERFORM pg_sleep(0.002);
  END LOOP;
  RAISE NOTICE 'found pid=%', coalesce(found::text, '');
END \$\$});
	return '' if $rc != 0;
	return $err =~ /found pid=(\d+)/ ? $1 : '';
}

# key_row(NODE, DB, KEY[, SCOPE]): the key's row as a hash (status,
# last_error, attempts, ...), or undef when the key does not exist. Reads the
# table directly (no function call that could expire the lease lazily).
sub key_row
{
	my ($node, $db, $key, $scope) = @_;
	$scope //= 'default';
	my ($rc, $out) = $node->psql(
		$db, qq{
SELECT status, coalesce(last_error, ''), attempts, token,
       coalesce(result::text, ''), lease_until IS NOT NULL AND lease_until <= clock_timestamp(),
       coalesce(expires_at::text, '')
  FROM idempotency.idempotency_keys WHERE scope = '$scope' AND key = '$key'});
	return undef if $rc != 0 || !defined $out || $out eq '';
	my @f = split /\|/, $out, -1;
	return {
		status => $f[0],
		last_error => $f[1],
		attempts => $f[2],
		token => $f[3],
		result => $f[4],
		lease_over => $f[5] eq 't',
		expires_at => $f[6],
	};
}

# SQL that claims KEY with LEASE and returns "outcome|token".
sub claim_sql
{
	my ($key, $lease, $scope) = @_;
	$scope //= 'default';
	return "SELECT c.outcome || '|' || coalesce(c.token::text, '') FROM "
	  . "idempotency.idem_claim('$key', NULL, '$lease'::interval, '$scope') c";
}

# Waits until a worker serves DB (a 100 ms lease claimed there expires), so
# that timings measured next do not include the launcher finding the
# database. Returns the seconds waited, or undef.
my $warmups = 0;
sub wait_served
{
	my ($node, $db, $timeout) = @_;
	my $key = 'warm-up-' . ++$warmups;
	$node->safe_psql($db, claim_sql($key, '100 milliseconds', 'warm-up'));
	return poll_until(
		$timeout // 10,
		sub {
			my $row = key_row($node, $db, $key, 'warm-up');
			$row && $row->{status} ne 'PROCESSING';
		});
}

# percentile(P, LIST): nearest-rank percentile of the values.
sub percentile
{
	my ($p, @values) = @_;
	return 0 unless @values;
	my @sorted = sort { $a <=> $b } @values;
	my $rank = int($p / 100 * @sorted + 0.999999);
	$rank = 1 if $rank < 1;
	$rank = @sorted if $rank > @sorted;
	return $sorted[ $rank - 1 ];
}

sub fmt_ms { return sprintf('%.0f ms', $_[0] * 1000); }

# lease_expiry_delay(NODE, DB, KEY, TIMEOUT_S[, MEANWHILE]): claims a 1 s
# lease of KEY in DB (a test), runs MEANWHILE if given, and waits up to
# TIMEOUT_S for a worker to expire the lease; returns the seconds from the
# lease's end to its expiry, as the row says, or undef when it was not.
sub lease_expiry_delay
{
	my ($node, $db, $key, $timeout, $meanwhile) = @_;
	like($node->safe_psql($db, claim_sql($key, '1 second')), qr/^claimed/, "$db: a 1 s lease claimed");
	$meanwhile->() if $meanwhile;
	return undef unless poll_until(
		$timeout,
		sub {
			my $row = key_row($node, $db, $key);
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		});
	return $node->safe_psql($db,
		"SELECT extract(epoch FROM updated_at - (claimed_at + interval '1 second')) "
		  . "FROM idempotency.idempotency_keys WHERE key = '$key'");
}

# on_time_tries(BOUND_S, TRY): delays (seconds, undef: none) of up to three
# tries, TRY->(N) giving the delay of try N, until one is under BOUND_S. A
# bound on time meets a machine busy with other work, which may hold a
# worker's start back once (a psql connection alone took 300 ms on a loaded
# CI machine): a try that misses the bound is made again, each with a new
# lease. A delay that is the extension's own misses it every time.
sub on_time_tries
{
	my ($bound, $try) = @_;
	my @delays;
	for my $n (1 .. 3)
	{
		push @delays, $try->($n);
		last if defined $delays[-1] && $delays[-1] < $bound;
	}
	return @delays;
}

1;
