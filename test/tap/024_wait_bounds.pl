# Every wait is a bound, and a call without one never blocks. While another
# transaction holds, uncommitted, the creation of a key (an idem_claim), the
# creation of a lock (an idem_lock), or the row of an existing key or lock
# (a claim of a due retry, a late complete, an unlock), idem_claim without
# `wait` answers in_progress at once (status NULL when the key is not
# committed yet, its committed status otherwise) and idem_lock answers NULL
# at once; with wait => '1s' each returns within 1 s + 50 ms with the same
# answer. When the holder ends during a wait, the waiter answers at once with
# what committed. Times are measured on the server (clock_timestamp()
# around the call), so the client's latency does not count. On a busy or
# paused machine an upper bound holds when one of three tries meets it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $slack_ms = 50;

# No worker: the leases that end below stay as they are (PROCESSING, held).
my $node = idem_node('wait_bounds', conf => ["idempotency.worker_enabled = off"]);
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE timed (label text PRIMARY KEY, answer text NOT NULL, ms numeric NOT NULL,
                    returned_at timestamptz NOT NULL);
-- One call, timed on the server; its answer and milliseconds are recorded.
CREATE FUNCTION timed_claim(label text, k text, w interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    c idempotency.idem_outcome;
    answer text;
BEGIN
    c := idempotency.idem_claim(k, wait => w);
    answer := c.outcome || ' ' || coalesce(c.status::text, 'NULL') || coalesce(' ' || c.result::text, '');
    INSERT INTO timed VALUES (label, answer, extract(epoch FROM clock_timestamp() - t0) * 1000,
                              clock_timestamp());
    RETURN answer;
END $$;
CREATE FUNCTION timed_lock(label text, resource text, w interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    token bigint;
BEGIN
    token := idempotency.idem_lock(resource, '1 hour', wait => w);
    INSERT INTO timed VALUES (label, CASE WHEN token IS NULL THEN 'NULL' ELSE 'token' END,
                              extract(epoch FROM clock_timestamp() - t0) * 1000, clock_timestamp());
    RETURN token;
END $$;});

# A call that blocks on the old behaviour ends with an error here instead of
# hanging the test.
my $timeout = "SET statement_timeout = '3s';";

# Runs a timed call (timed_claim or timed_lock) and returns (answer, ms);
# a call that ended in an error (the statement timeout) gives ().
sub timed
{
	my ($label, $call) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "$timeout SELECT $call");
	diag("$label: $err") if $rc != 0;
	my $row = $node->safe_psql('postgres', "SELECT answer || '|' || round(ms, 1) FROM timed WHERE label = '$label'");
	return $row eq '' ? () : split /\|/, $row;
}

# A busy machine can only add time to a call, never take it away, and a
# machine paused for a while (as a virtual machine can be) makes even the
# statement timeout fire late: an upper bound is met when one of up to
# $tries tries meets it, and a try that did not return in time is made
# again. Every answer that came is checked, and so is a wait's lower bound;
# a call that blocks on its holder misses the bound in every try.
my $tries = 3;

# Checks a call without wait and the same call with wait => '1s'.
sub check_bounds
{
	my ($what, $function, $target, $expected) = @_;
	for my $wait ('NULL', "'1s'")
	{
		my $name = $wait eq 'NULL' ? 'no wait' : 'wait 1s';
		my $floor = $wait eq 'NULL' ? 0 : 1000;
		my (@answers, @ms, @seen);
		for my $try (1 .. $tries)
		{
			my $label = "$what $name $try" =~ s/\W+/-/gr;
			my ($answer, $ms) = timed($label, "$function('$label', '$target', $wait)");
			push @seen, defined $ms ? "$ms ms" : 'no answer';
			next unless defined $answer;
			push @answers, $answer;
			push @ms, $ms;
			last if $ms < $floor + $slack_ms;
		}
		ok(@answers && !grep({ $_ ne $expected } @answers), "$what, $name: answers $expected (@answers)");
		ok(!grep({ $_ < $floor } @ms), "$what, $name: never before $floor ms (" . join(', ', @seen) . ')') if $floor;
		my $fastest = (sort { $a <=> $b } @ms, 99999)[0];
		cmp_ok($fastest, '<', $floor + $slack_ms,
			($floor ? "$what, $name: returns within 1 s + $slack_ms ms" : "$what, $name: at once") . ' (' . join(', ', @seen) . ')');
	}
}

# A session holding its transaction open.
sub holder
{
	my ($sql) = @_;
	my $session = $node->background_psql('postgres');
	$session->query_safe('BEGIN');
	my $out = $session->query_safe($sql);
	return ($session, $out);
}

# Each case makes its holder for the keys ending in SUFFIX and returns
# (holder session, key or resource, the holder's work before it ends).
my %cases = (
	creating => sub {
		my $key = "k-new$_[0]";
		my ($h, $token) = holder("SELECT token FROM idempotency.idem_claim('$key', lease => '1 hour')");
		return ($h, $key, "SELECT idempotency.idem_complete('$key', $token, '{\"done\": 1}')");
	},
	retrying => sub {
		my $key = "k-retry$_[0]";
		$node->safe_psql('postgres',
			"SELECT idempotency.idem_fail('$key', (idempotency.idem_claim('$key')).token, 'boom', true, '0')");
		my ($h) = holder("SELECT idempotency.idem_claim('$key', lease => '1 hour')");
		return ($h, $key, '');
	},
	completing_late => sub {
		my $key = "k-late$_[0]";
		my $token = $node->safe_psql('postgres',
			"SELECT token FROM idempotency.idem_claim('$key', lease => '1 millisecond')");
		usleep(10_000);
		my ($h) = holder("SELECT idempotency.idem_complete('$key', $token, '{\"late\": 1}')");
		return ($h, $key, '');
	},
	locking => sub {
		my $resource = "r-new$_[0]";
		my ($h) = holder("SELECT idempotency.idem_lock('$resource', '1 hour')");
		return ($h, $resource, '');
	},
	unlocking => sub {
		my $resource = "r-row$_[0]";
		my $token = $node->safe_psql('postgres', "SELECT idempotency.idem_lock('$resource', '1 millisecond')");
		usleep(10_000);
		my ($h) = holder("SELECT idempotency.idem_unlock('$resource', $token)");
		return ($h, $resource, '');
	});

# --- holders that do not end ---------------------------------------------------
my %held = map { $_ => [ $cases{$_}->('') ] } sort keys %cases;
check_bounds('a key another transaction is creating', 'timed_claim', $held{creating}[1], 'in_progress NULL');
check_bounds('a due retry another transaction is claiming', 'timed_claim', $held{retrying}[1],
	'in_progress FAILED_RETRYABLE');
check_bounds('an ended lease whose holder is completing late', 'timed_claim', $held{completing_late}[1],
	'in_progress PROCESSING');
check_bounds('a lock another transaction is taking', 'timed_lock', $held{locking}[1], 'NULL');
check_bounds('an expired lock another transaction is releasing', 'timed_lock', $held{unlocking}[1], 'NULL');

# --- holders that end during the wait ---------------------------------------------
# Starts the call in a new session and lets the holder, once the call
# waits, run its work and end with END (COMMIT or ROLLBACK). Returns
# whether the call was seen waiting, its answer (undef: it did not return,
# its statement timed out) and how long after the holder's end it came.
sub one_end_during_wait
{
	my ($label, $function, $holder, $target, $work, $end) = @_;
	my $waiter = $node->background_psql('postgres');
	my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
	$waiter->query_until(qr/started\n/, "\\echo started\n$timeout SELECT $function('$label', '$target', '5s');\n");
	my $waited = poll_until(
		10,
		sub {
			$node->safe_psql('postgres',
				"SELECT state = 'active' AND wait_event IS NOT NULL FROM pg_stat_activity WHERE pid = $pid") eq 't';
		},
		5);
	usleep(100_000);
	$holder->query_safe($work) if $work ne '';
	my $ended_at = $holder->query_safe("SELECT clock_timestamp(); $end");
	$holder->quit;
	poll_until(10, sub { $node->safe_psql('postgres', "SELECT count(*) FROM timed WHERE label = '$label'") eq '1' });
	# A waiter whose statement failed has ended its psql (ON_ERROR_STOP).
	eval { $waiter->quit; 1 } or diag("$label: the waiter's session had ended: $@");
	my ($answer, $after) = split /\|/, $node->safe_psql('postgres',
		"SELECT answer || '|' || round(extract(epoch FROM returned_at - '$ended_at'::timestamptz) * 1000, 1) "
		  . "FROM timed WHERE label = '$label'");
	return ($waited, $answer, $after);
}

# The case held above ends first; a try that misses the bound is made again
# with a new holder of its own.
sub ended_during_wait
{
	my ($what, $case, $function, $end, $expected) = @_;
	my (@answers, @seen);
	my $met = 0;
	for my $try (1 .. $tries)
	{
		my ($holder, $target, $work) = $try == 1 ? @{ $held{$case} } : $cases{$case}->("-$try");
		my ($waited, $answer, $after) =
		  one_end_during_wait("$case-$end-$try", $function, $holder, $target, $work, $end);
		push @answers, $answer if defined $answer;
		push @seen, !$waited ? 'not seen waiting' : defined $after ? "$after ms" : 'did not return';
		$met = $waited && defined $after && $after < $slack_ms;
		last if $met;
	}
	ok(@answers && !grep({ $_ !~ $expected } @answers), "$what (@answers)");
	ok($met, "... waited, and returned at once after the $end (" . join(', ', @seen) . ')');
}

ended_during_wait('the creator commits a completion: the waiter replays it',
	'creating', 'timed_claim', 'COMMIT', qr/^completed COMPLETED \{"done": 1\}$/);
ended_during_wait('the late completion commits: the waiter replays it',
	'completing_late', 'timed_claim', 'COMMIT', qr/^completed COMPLETED \{"late": 1\}$/);
ended_during_wait('the claim of the due retry rolls back: the waiter claims it',
	'retrying', 'timed_claim', 'ROLLBACK', qr/^claimed PROCESSING/);
ended_during_wait('the lock taken by another transaction rolls back: the waiter takes it',
	'locking', 'timed_lock', 'ROLLBACK', qr/^token$/);
ended_during_wait('the release of the expired lock commits: the waiter takes it',
	'unlocking', 'timed_lock', 'COMMIT', qr/^token$/);

$node->stop;
done_testing();
