# Wake-up latency of a waiting duplicate: how long after the holder completes
# does a caller blocked in idem_claim(key, wait => '5s') return?
#
# Each round: session A claims a new key; session B starts
# idem_claim(key, wait => '5s') and goes to sleep (seen in pg_stat_activity);
# after a pause of 60-100 ms (so that a polling waiter has reached its
# steady pace) A completes the key and commits. B stores clock_timestamp()
# as its call returns; the latency is that minus the key's completed_at.
#
# Measured with the library preloaded (B sleeps on a shared condition
# variable that A's commit broadcasts) and without it (B polls), and printed
# side by side. The only assertions: every waiter replays the result, and
# with preload the median stays under a generous 200 ms.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $rounds = $ENV{IDEM_LATENCY_ROUNDS} // 200;

# measure(NODE, LABEL): runs the rounds; returns (p50_ms, p99_ms, max_ms).
sub measure
{
	my ($node, $label) = @_;
	$node->safe_psql('postgres', q{
		CREATE EXTENSION idempotency;
		CREATE TABLE lat (round int PRIMARY KEY, returned_at timestamptz NOT NULL, outcome text NOT NULL);
	});
	my $a = $node->background_psql('postgres');
	my $b = $node->background_psql('postgres');
	$a->set_query_timer_restart;
	$b->set_query_timer_restart;
	my $b_pid = $b->query_safe('SELECT pg_backend_pid()');

	for my $i (1 .. $rounds)
	{
		my $key = "lat-$i";
		my $token = $a->query_safe(
			"SELECT token FROM idempotency.idem_claim('$key', lease => '30s')");
		# B's call starts; query_until returns once psql has read it.
		$b->query_until(qr/go $i\n/,
			"\\echo go $i\nINSERT INTO lat SELECT $i, clock_timestamp(), c.outcome "
			  . "FROM idempotency.idem_claim('$key', wait => '5s') c;\n");
		my $sleeping = 0;
		for (1 .. 5000)
		{
			$sleeping = $a->query_safe(
				"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $b_pid");
			last if $sleeping eq 't';
			usleep(1_000);
		}
		die "round $i: the waiter never went to sleep" unless $sleeping eq 't';
		usleep(60_000 + int(rand(40_000)));
		$a->query_safe("SELECT idempotency.idem_complete('$key', $token, '{\"round\": $i}')");
		# B has finished once it answers the next query.
		$b->query_safe('SELECT 1');
	}
	$a->quit;
	$b->quit;

	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FILTER (WHERE outcome = 'completed') || '/' || count(*) FROM lat"),
		"$rounds/$rounds",
		"$label: every waiting duplicate replayed the result");
	my ($p50, $p99, $max, $min) = split /\|/, $node->safe_psql(
		'postgres', q{
		SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
		       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2),
		       round(max(ms)::numeric, 2), round(min(ms)::numeric, 2)
		  FROM (SELECT extract(epoch FROM l.returned_at - k.completed_at) * 1000 AS ms
		          FROM lat l JOIN idempotency.idempotency_keys k
		            ON k.scope = 'default' AND k.key = 'lat-' || l.round) s
	});
	diag(sprintf('%-28s %d rounds: median %s ms, p99 %s ms (min %s, max %s)',
			"wake-up latency, $label:", $rounds, $p50, $p99, $min, $max));
	return ($p50, $p99, $max);
}

# With the library preloaded: wake-ups on commit.
my $preload = PostgreSQL::Test::Cluster->new('latency_preload');
$preload->init;
$preload->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\nidempotency.worker_enabled = off\n");
$preload->start;
my ($p50_cv, $p99_cv) = measure($preload, 'preload');
cmp_ok($p50_cv, '<', 200, 'with preload the median wake-up latency is under 200 ms');
$preload->stop;

# Without preload: the waiter polls.
my $polling = PostgreSQL::Test::Cluster->new('latency_polling');
$polling->init;
$polling->start;
my ($p50_poll, $p99_poll) = measure($polling, 'polling (no preload)');
$polling->stop;

diag(sprintf('wake-up latency median/p99: preload %s/%s ms, polling %s/%s ms',
		$p50_cv, $p99_cv, $p50_poll, $p99_poll));

done_testing();
