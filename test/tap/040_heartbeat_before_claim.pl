# A heartbeat that waits for the holder's fenced transaction renews the
# lease before a claim that comes as that transaction ends. The holder claims
# a key with a short lease, locks its row with idem_assert_owner in a
# transaction, and a heartbeat from another session waits for that row; once
# the lease has ended, the holder commits and claims the key again in the
# same query, right after its commit. PostgreSQL gives an unlocked row to
# whoever asks first, so without the claim giving way to the row's waiter the
# claim took the key over (claimed) in most rounds and the heartbeat got
# IK001; with it, the claim answers in_progress and the heartbeat renews. A
# claim with `wait` does so too: it waits for the heartbeat's transaction,
# then answers in_progress from the renewed lease.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $rounds = 10;

my $node = idem_node('beat_first', conf => ["idempotency.worker_enabled = off"]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $holder = $node->background_psql('postgres');

# fenced_with_waiting_heartbeat(KEY): the holder claims KEY with a 300 ms
# lease and locks its row with idem_assert_owner in a transaction left open;
# a heartbeat from another session waits for that row past the lease.
# Returns the heartbeat's session.
sub fenced_with_waiting_heartbeat
{
	my ($key) = @_;
	my $token = $holder->query_safe(
		"SELECT token FROM idempotency.idem_claim('$key', lease => '300 ms')");
	$holder->query_safe('BEGIN');
	$holder->query_safe("SELECT idempotency.idem_assert_owner('$key', $token)");

	my $beat = $node->background_psql('postgres');
	$beat->query_until(qr/beating\n/,
		"\\echo beating\nSELECT 'beat:' || (idempotency.idem_heartbeat('$key', $token, extend => '1 min') IS NOT NULL);\n");
	ok( poll_until(
			60,
			sub {
				$node->safe_psql('postgres',
					"SELECT count(*) FROM pg_stat_activity
					  WHERE wait_event_type = 'Lock' AND query LIKE '%idem_heartbeat%'") == 1;
			}),
		"$key: the heartbeat waits for the fenced transaction");
	ok( poll_until(
			60,
			sub {
				$node->safe_psql('postgres',
					"SELECT lease_until < clock_timestamp() FROM idempotency.idempotency_keys
					  WHERE key = '$key'") eq 't';
			}),
		"$key: the lease has ended");
	return $beat;
}

# heartbeat_result(SESSION): the heartbeat's answer (stdout) and error
# (stderr) once its statement has ended, which it does once the holder's
# transaction has. A refused heartbeat ends its psql (ON_ERROR_STOP), so no
# query may be sent after it: the session's output is read as it comes.
sub heartbeat_result
{
	my ($beat) = @_;
	poll_until(
		60,
		sub {
			eval { $beat->{run}->pump_nb if $beat->{run}->pumpable };
			$beat->{stdout} =~ /beat:/ || $beat->{stderr} =~ /ERROR/;
		});
	my @result = ($beat->{stdout}, $beat->{stderr});
	eval { $beat->quit };
	return @result;
}

# fenced_round(KEY, CLAIM_ARGS): the holder's fenced transaction, a
# heartbeat waiting for it past the lease, then the commit and a claim
# (idem_claim(KEY CLAIM_ARGS)) in one query. Returns the claim's outcome and
# whether the heartbeat renewed the lease.
sub fenced_round
{
	my ($key, $claim_args) = @_;
	my $beat = fenced_with_waiting_heartbeat($key);

	# One query: the claim starts right after the commit, before the woken
	# heartbeat has had a chance to run.
	$holder->{stderr} = '';
	my $claim = $holder->query(
		"COMMIT \\; SELECT 'claim:' || outcome FROM idempotency.idem_claim('$key'$claim_args);");
	my ($answer, $beat_stderr) = heartbeat_result($beat);
	my $outcome = $claim =~ /claim:(\w+)/ ? $1 : "none ($claim $holder->{stderr})";
	my $renewed = $answer =~ /beat:true/ ? 'renewed' : "refused ($beat_stderr)";
	return ($outcome, $renewed);
}

# rounds(NAME, CLAIM_ARGS): $rounds fenced rounds; each claim must answer
# in_progress and each heartbeat renew.
sub rounds
{
	my ($name, $claim_args) = @_;
	my (@claims, @beats);
	for my $round (1 .. $rounds)
	{
		my ($claim, $beat) = fenced_round("$name-$round", $claim_args);
		push @claims, $claim;
		push @beats, $beat;
	}
	is(scalar(grep { $_ eq 'in_progress' } @claims), $rounds,
		"$name: in each of $rounds rounds the claim right after the commit answers in_progress")
	  or diag(join(', ', @claims));
	is(scalar(grep { $_ eq 'renewed' } @beats), $rounds,
		"$name: in each round the heartbeat that waited renews the lease")
	  or diag(join(', ', @beats));
}

rounds('fenced', '');
# A claim that may wait waits for the heartbeat first (its wait does not
# take the row before it), then finds the renewed lease.
rounds('fenced-waiting', ", wait => '5 s'");

# The transaction that holds the row claims the key itself, waiting: the
# heartbeat waits for this very transaction, so the claim does not wait for
# it (that would be a deadlock); it takes the key over, as the holder of the
# row may.
{
	my $beat = fenced_with_waiting_heartbeat('own-row');
	$holder->{stderr} = '';
	my $claim = $holder->query(
		"SELECT 'claim:' || outcome FROM idempotency.idem_claim('own-row', wait => '5 s')");
	is($claim, 'claim:claimed', 'own-row: the claim in the transaction that holds the row takes the key')
	  or diag($holder->{stderr});
	$holder->query_safe('COMMIT');
	# Had the claim waited for the heartbeat, the deadlock check would have
	# ended one of the two: the claim, or (when the claim came within
	# deadlock_timeout of the heartbeat's wait) the heartbeat.
	my (undef, $beat_stderr) = heartbeat_result($beat);
	like($beat_stderr, qr/stale token/,
		'own-row: the heartbeat is then refused, as the key was claimed again (no deadlock)');
}

$holder->quit;
done_testing();
