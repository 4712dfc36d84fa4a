# idempotency.expire_on_disconnect: when on, a PROCESSING key whose claiming
# backend has exited (its connection closed, or the backend was killed) is
# expired by the worker within about one naptime instead of at the end of its
# lease; a lease whose backend is alive is never expired early. When off, the
# key stays PROCESSING until its lease ends.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $naptime = 0.2;
my $node = idem_node('disconnect', conf => ["idempotency.expire_on_disconnect = on"]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok(wait_served($node, 'postgres'), 'a worker serves the database');

sub status_of
{
	my $row = key_row($node, 'postgres', $_[0]);
	return $row ? $row->{status} : '';
}

sub expired_within
{
	my ($key, $timeout) = @_;
	return poll_until($timeout, sub { status_of($key) eq 'FAILED_RETRYABLE' }, 20);
}

# Server clock, in epoch seconds.
sub server_now
{
	return $node->safe_psql('postgres', 'SELECT extract(epoch FROM clock_timestamp())');
}

sub expired_at
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT extract(epoch FROM updated_at) FROM idempotency.idempotency_keys WHERE key = '$key'");
}

my $restarts = 0;
sub crash_restarts
{
	my @r = slurp_file($node->logfile) =~ /all server processes terminated; reinitializing/g;
	return scalar @r;
}

# A session that claims KEY with LEASE and stays connected; returns it and
# its backend pid.
sub holder
{
	my ($key, $lease) = @_;
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	like($session->query_safe(claim_sql($key, $lease)), qr/^claimed/, "$key claimed by backend $pid");
	return ($session, $pid);
}

# --- on: the connection closes normally -----------------------------------------
my $t_claim = server_now();
like($node->safe_psql('postgres', claim_sql('gentle', '1 hour')),
	qr/^claimed/, 'claimed with a 1 hour lease by a psql that then exits');
ok(expired_within('gentle', 5), 'the key is expired once its backend has exited');
my $gentle = expired_at('gentle') - $t_claim;
diag(sprintf('expire_on_disconnect: claim, psql exits -> expiry: %s (naptime 200ms)', fmt_ms($gentle)));
cmp_ok($gentle, '<', $naptime + 2, 'within about one naptime');
my $row = key_row($node, 'postgres', 'gentle');
is_deeply([ $row->{status}, $row->{last_error}, $row->{attempts} ],
	[ 'FAILED_RETRYABLE', 'lease expired', 1 ], "FAILED_RETRYABLE, last_error 'lease expired'");
like($node->safe_psql('postgres', claim_sql('gentle', '1 minute')),
	qr/^claimed/, 'and claimable again at once');

# --- on: a live holder keeps its lease ---------------------------------------------
my ($alive, $alive_pid) = holder('alive', '1 hour');
my ($in_xact, $in_xact_pid) = holder('alive-2', '1 hour');
$in_xact->query_safe('BEGIN; SELECT 1');    # busy in a transaction, still alive
usleep(10 * $naptime * 1_000_000);
is(status_of('alive'), 'PROCESSING', 'a live holder keeps its key PROCESSING after 10 naptimes');
is(status_of('alive-2'), 'PROCESSING', 'so does a live holder inside an open transaction');
$in_xact->query_safe('COMMIT');
# The same session closing its connection normally.
my $t_quit = server_now();
$alive->quit;
ok(expired_within('alive', 5), 'once that session quits, its key is expired');
diag(sprintf('expire_on_disconnect: holder session quits -> expiry: %s',
		fmt_ms(expired_at('alive') - $t_quit)));
is(status_of('alive-2'), 'PROCESSING', 'the other live holder still holds its key');

# --- on: the holder's backend is killed (the whole cluster restarts) -------------
$in_xact->quit;
ok(expired_within('alive-2', 5), 'closing the second session frees its key too');
my ($victim, $victim_pid) = holder('killed-on', '1 hour');
ok(kill('KILL', $victim_pid), "kill -9 of the holder's backend $victim_pid");
eval { $victim->quit; };
ok(poll_until(30, sub { crash_restarts() == 1 }), 'the postmaster restarts all backends');
ok(wait_until_up($node, 60), 'the cluster is back');
my $t_up = server_now();
ok(expired_within('killed-on', 5), 'the killed holder\'s key is expired');
my $killed_on = expired_at('killed-on') - $t_up;
diag(sprintf('expire_on_disconnect: cluster back after the kill -9 -> expiry: %s', fmt_ms($killed_on)));
cmp_ok($killed_on, '<', $naptime + 2, 'within about one naptime after the cluster is back');
is(key_row($node, 'postgres', 'killed-on')->{last_error}, 'lease expired', "last_error 'lease expired'");

# --- off: the key waits for its lease ----------------------------------------------
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.expire_on_disconnect = off');
$node->reload;
usleep(2 * $naptime * 1_000_000);    # workers started before the reload are gone
like($node->safe_psql('postgres', claim_sql('gentle-off', '4 seconds')),
	qr/^claimed/, 'claimed with a 4 s lease by a psql that then exits');
($victim, $victim_pid) = holder('killed-off', '5 seconds');
ok(kill('KILL', $victim_pid), "kill -9 of the holder's backend $victim_pid");
eval { $victim->quit; };
ok(poll_until(30, sub { crash_restarts() == 2 }), 'the postmaster restarts all backends');
ok(wait_until_up($node, 60), 'the cluster is back');
usleep(5 * $naptime * 1_000_000);
for my $key ('gentle-off', 'killed-off')
{
	$row = key_row($node, 'postgres', $key);
	ok($row->{status} eq 'PROCESSING' && !$row->{lease_over},
		"$key: still PROCESSING before its lease ends (expire_on_disconnect off)");
}
for my $key ('gentle-off', 'killed-off')
{
	ok(expired_within($key, 10), "$key: expired once its lease ended");
	my $late = $node->safe_psql('postgres',
		"SELECT extract(epoch FROM updated_at - lease_until) FROM idempotency.idempotency_keys WHERE key = '$key'");
	diag(sprintf('expire_on_disconnect off: %s lease end -> expiry: %s', $key, fmt_ms($late)));
	cmp_ok($late, '>=', 0, "$key: not before its lease ended");
	cmp_ok($late, '<', 5, "$key: within 5 s of it");
}

$node->stop;
done_testing();
