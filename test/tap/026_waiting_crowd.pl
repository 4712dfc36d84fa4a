# A crowd waiting for one key costs its holder nothing, and a waiter wakes
# only for its own key. 30 sessions wait in idem_claim(key, wait => '60s')
# for a key the holder has claimed, and 5 more wait for other keys it holds.
# The holder's complete signals at most 2 of the waiting sessions (the woken
# hand the wake-up on), whatever the crowd's size: its commit reports how
# many it signalled (DEBUG1). Every waiter of the key then answers
# `completed`; the waiters of the other keys are not woken (a woken waiter
# says so at DEBUG2) until their own keys complete.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $crowd = 30;
my $others = 5;

my $node = idem_node('crowd', conf => ["idempotency.worker_enabled = off", "max_connections = 60"]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $holder = $node->background_psql('postgres');
my $token = $holder->query_safe(
	"SELECT token FROM idempotency.idem_claim('crowd', lease => '10 min')");
my @other_tokens = map {
	$holder->query_safe("SELECT token FROM idempotency.idem_claim('other-$_', lease => '10 min')")
} 1 .. $others;

# waiter(KEY, DEBUG): a session blocked in idem_claim(KEY, wait => '60s').
sub waiter
{
	my ($key, $debug) = @_;
	my $session = $node->background_psql('postgres');
	$session->query("SET client_min_messages = debug2") if $debug;
	$session->{stderr} = '';
	$session->query_until(qr/waiting\n/,
		"\\echo waiting\nSELECT 'answer:' || outcome FROM idempotency.idem_claim('$key', wait => '60s');\n");
	return $session;
}
my @crowd = map { waiter('crowd', 0) } 1 .. $crowd;
my @other = map { waiter("other-$_", 1) } 1 .. $others;

sub sleeping
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity
		  WHERE backend_type = 'client backend' AND wait_event_type = 'Extension'");
}
ok(poll_until(60, sub { sleeping() == $crowd + $others }), 'every waiter sleeps')
  or diag('sleeping: ' . sleeping());

# answer(SESSION): what its idem_claim returned (it has returned once the
# next query answers).
sub answer
{
	my ($session) = @_;
	my $out = $session->query('SELECT 1');
	return $out =~ /answer:(\w+)/ ? $1 : "none ($out)";
}

$holder->query('SET client_min_messages = debug1');
$holder->{stderr} = '';
$holder->query("SELECT idempotency.idem_complete('crowd', $token, '{\"done\": true}')");
my ($signalled) = $holder->{stderr} =~ /the commit signalled (\d+) waiting session\(s\) for 1 key/;
ok(defined $signalled, 'the holder\'s commit reports the sessions it signalled')
  or diag($holder->{stderr});
cmp_ok($signalled // 99, '<=', 2,
	"the holder signals at most 2 of the $crowd waiting sessions");

my @answers = map { answer($_) } @crowd;
is(scalar(grep { $_ eq 'completed' } @answers), $crowd, "all $crowd waiters answer completed")
  or diag(join(', ', @answers));

# The other keys' waiters slept through it, and still wait.
is(scalar(grep { $_->{stderr} =~ /woken by a commit/ } @other), 0,
	'no waiter of another key was woken');
is(sleeping(), $others, 'the waiters of the other keys still wait');

# Their own keys complete (in one transaction): each is woken and answers.
$holder->{stderr} = '';
$holder->query(join('', 'BEGIN;',
	map({ "SELECT idempotency.idem_complete('other-$_', $other_tokens[$_ - 1]);" } 1 .. $others),
	'COMMIT;'));
my ($for_others) = $holder->{stderr} =~ /the commit signalled (\d+) waiting session\(s\) for $others key/;
is($for_others, $others, 'a commit of several keys signals each key\'s waiter');
is(scalar(grep { answer($_) eq 'completed' } @other), $others,
	'the waiters of the other keys answer completed');
is(scalar(grep { $_->{stderr} =~ /woken by a commit/ } @other), $others,
	'each of them was woken by its own key\'s commit');

$_->quit for @crowd, @other, $holder;
$node->stop;
done_testing();
