# A large purge does not get in the way of the application: while the worker
# purges 1,000,000 expired keys (purge_batch 10000, one transaction per
# batch, rows locked with SKIP LOCKED), a session keeps claiming and
# completing keys. Prints the claim latency (median, p99) with and without
# the purge, and the purge's duration; asserts only that every claim
# succeeded and that every expired key was purged, the purge never stalling.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $rows = 1_000_000;
my $node = idem_node(
	'purge',
	conf => [
		"log_statement = none",
		"shared_buffers = '256MB'",
		"max_wal_size = '2GB'",
		"checkpoint_timeout = '30min'",
	]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok(wait_served($node, 'postgres'), 'a worker serves the database');

# A session that claims and completes fresh keys, one pair after the other,
# for at least MIN seconds and until DONE returns true (at most MAX seconds).
# Returns the claim latencies (ms, as psql's \timing measures them), how
# many pairs ran, and psql's stderr.
sub claim_loop
{
	my ($prefix, $min, $max, $done) = @_;
	my ($in, $out, $err) = ("\\timing on\n", '', '');
	my $psql = IPC::Run::start(
		[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-v', 'ON_ERROR_STOP=1' ],
		'<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout($max + 60));
	my ($i, $start, $next_check, $finished) = (0, time, 0, 0);
	while (1)
	{
		my $elapsed = time - $start;
		if ($elapsed >= $min && time >= $next_check)
		{
			$finished = !$done || $done->();
			$next_check = time + 0.25;
		}
		last if $finished || $elapsed >= $max || $err ne '';
		for (1 .. 20)
		{
			$i++;
			$in .= "SELECT (idempotency.idem_claim('$prefix-$i')).token AS t \\gset\n"
			  . "SELECT idempotency.idem_complete('$prefix-$i', :t, '{\"ok\": true}') IS NOT NULL AS c \\gset\n";
		}
		$psql->pump while length $in;
	}
	$in .= "\\q\n";
	$psql->finish;
	my @times = $out =~ /^Time: ([\d.]+) ms/mg;
	my @claims = @times[ grep { $_ % 2 == 0 } 0 .. $#times ];
	return (\@claims, $i, $err, time - $start);
}

sub report
{
	my ($label, $claims, $pairs, $secs) = @_;
	diag(sprintf('%s: %d claim+complete pairs in %.1f s; claim latency median %.3f ms, p99 %.3f ms, max %.3f ms',
			$label, $pairs, $secs, percentile(50, @$claims), percentile(99, @$claims),
			percentile(100, @$claims)));
}

sub completed
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE '$prefix-%' AND status = 'COMPLETED'");
}

# --- without a purge --------------------------------------------------------------
my ($base, $base_pairs, $base_err, $base_secs) = claim_loop('base', 5, 5);
is($base_err, '', 'baseline loop: no error');
is(completed('base'), $base_pairs, "baseline: all $base_pairs claims and completes succeeded");
report('without purge', $base, $base_pairs, $base_secs);

# --- with a purge of a million expired keys ---------------------------------------
# Loaded with the workers off, so that the purge starts with the loop.
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.worker_enabled = off');
$node->reload;
my $t = time;
$node->safe_psql(
	'postgres', qq{
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at,
   purge_at)
SELECT 'expired', 'old-' || g, 'COMPLETED', g, 1, '{"old": true}',
       now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
       now() - interval '1 day', now() - interval '1 day'
  FROM generate_series(1, $rows) g;});
note(sprintf('loading %d expired keys took %.1f s', $rows, time - $t));

my $left = sub {
	return $node->safe_psql('postgres',
		q{SELECT count(*) FROM (SELECT 1 FROM idempotency.idempotency_keys WHERE scope = 'expired' LIMIT 1) s});
};
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.worker_enabled = on');
$node->reload;
my $purge_start = time;
my $purge_end;
my ($during, $pairs, $err, $secs) = claim_loop(
	'during', 5, 30,
	sub {
		return 1 if $purge_end;
		$purge_end = time if $left->() eq '0';
		return defined $purge_end;
	});
is($err, '', 'loop during the purge: no error');
is(completed('during'), $pairs, "during the purge: all $pairs claims and completes succeeded");
report('during purge ', $during, $pairs, $secs);

# The purge may outlast the loop (a slow or busy machine): wait for it as long
# as it makes progress, and fail only when no batch has been purged for
# STALL seconds.
my $stall = 30;
unless ($purge_end)
{
	my $count = sub {
		return $node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'expired'}) + 0;
	};
	my ($remaining, $moved_at) = ($count->(), time);
	while ($remaining > 0 && time - $moved_at <= $stall)
	{
		usleep(500_000);
		my $now = $count->();
		($remaining, $moved_at) = ($now, time) if $now < $remaining;
	}
	$purge_end = time if $remaining == 0;
}
ok($purge_end, "all $rows expired keys were purged, no batch $stall s apart");
diag(sprintf('purge of %d expired keys (purge_batch 10000): %.1f s (%.0f rows/s)',
		$rows, ($purge_end // time) - $purge_start, $rows / (($purge_end // time) - $purge_start)))
  if $purge_end;
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'expired'}),
	'0', 'none left');
is(completed('base') + 0, $base_pairs, 'the application keys were not touched by the purge');

unlike(slurp_file($node->logfile),
	qr/background worker "idempotency \w+" \(PID \d+\) exited with exit code [1-9]/,
	'no worker error');
$node->stop;
done_testing();
