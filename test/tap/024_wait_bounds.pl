# Every wait is a bound, and a call without one never blocks. While another
# transaction holds, uncommitted, the creation of a key (an idem_claim), the
# creation of a lock (an idem_lock), or the row of an existing key or lock
# (a claim of a due retry, a late complete, an unlock), idem_claim without
# `wait` answers in_progress at once (status NULL when the key is not
# committed yet, its committed status otherwise) and idem_lock answers NULL
# at once; with wait => '1s' each returns within 1 s + 50 ms with the same
# answer. When the holder ends during a wait, the waiter answers at once with
# what committed. Times are measured on the server (clock_timestamp()
# around the call), so the client's latency does not count.
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
# a call that ended in an error (the statement timeout) gives ('none', 99999).
sub timed
{
	my ($label, $call) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "$timeout SELECT $call");
	diag("$label: $err") if $rc != 0;
	my $row = $node->safe_psql('postgres', "SELECT answer || '|' || round(ms, 1) FROM timed WHERE label = '$label'");
	return split /\|/, $row eq '' ? 'none|99999' : $row;
}

# Checks a call without wait and the same call with wait => '1s'.
sub check_bounds
{
	my ($what, $function, $target, $expected) = @_;
	my $label = $what =~ s/\W+/-/gr;
	my ($answer, $ms) = timed("$label-now", "$function('$label-now', '$target', NULL)");
	is($answer, $expected, "$what, no wait: answers $expected");
	cmp_ok($ms, '<', $slack_ms, "$what, no wait: at once ($ms ms)");
	($answer, $ms) = timed("$label-1s", "$function('$label-1s', '$target', '1s')");
	is($answer, $expected, "$what, wait 1s: answers $expected");
	ok($ms >= 1000 && $ms <= 1000 + $slack_ms, "$what, wait 1s: returns within 1 s + $slack_ms ms ($ms ms)");
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

# --- holders that do not end ---------------------------------------------------
my ($h1, $t_new) = holder(q{SELECT token FROM idempotency.idem_claim('k-new', lease => '1 hour')});
check_bounds('a key another transaction is creating', 'timed_claim', 'k-new', 'in_progress NULL');

$node->safe_psql('postgres',
	q{SELECT idempotency.idem_fail('k-retry', (idempotency.idem_claim('k-retry')).token, 'boom', true, '0')});
my ($h2) = holder(q{SELECT idempotency.idem_claim('k-retry', lease => '1 hour')});
check_bounds('a due retry another transaction is claiming', 'timed_claim', 'k-retry',
	'in_progress FAILED_RETRYABLE');

my $t_late = $node->safe_psql('postgres', q{SELECT token FROM idempotency.idem_claim('k-late', lease => '1 millisecond')});
usleep(10_000);
my ($h3) = holder("SELECT idempotency.idem_complete('k-late', $t_late, '{\"late\": 1}')");
check_bounds('an ended lease whose holder is completing late', 'timed_claim', 'k-late', 'in_progress PROCESSING');

my ($h4) = holder(q{SELECT idempotency.idem_lock('r-new', '1 hour')});
check_bounds('a lock another transaction is taking', 'timed_lock', 'r-new', 'NULL');

my $t_lock = $node->safe_psql('postgres', q{SELECT idempotency.idem_lock('r-row', '1 millisecond')});
usleep(10_000);
my ($h5) = holder("SELECT idempotency.idem_unlock('r-row', $t_lock)");
check_bounds('an expired lock another transaction is releasing', 'timed_lock', 'r-row', 'NULL');

# --- holders that end during the wait ---------------------------------------------
# Starts the call in a new session and returns once it waits; HOLDER then
# runs WORK and ends with END (COMMIT or ROLLBACK). Returns the call's
# answer, how long after the holder's end it came, and its whole time.
sub ended_during_wait
{
	my ($label, $call, $holder, $work, $end) = @_;
	my $waiter = $node->background_psql('postgres');
	my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
	$waiter->query_until(qr/started\n/, "\\echo started\n$timeout SELECT $call;\n");
	my $waiting = poll_until(
		10,
		sub {
			$node->safe_psql('postgres',
				"SELECT state = 'active' AND wait_event IS NOT NULL FROM pg_stat_activity WHERE pid = $pid") eq 't';
		},
		5);
	ok($waiting, "$label: the waiter waits");
	usleep(100_000);
	$holder->query_safe($work) if $work ne '';
	my $ended_at = $holder->query_safe("SELECT clock_timestamp(); $end");
	$holder->quit;
	ok(poll_until(10, sub { $node->safe_psql('postgres', "SELECT count(*) FROM timed WHERE label = '$label'") eq '1' }),
		"$label: the waiter returned");
	$waiter->quit;
	return split /\|/, $node->safe_psql('postgres',
		"SELECT answer || '|' || round(extract(epoch FROM returned_at - '$ended_at'::timestamptz) * 1000, 1) "
		  . "|| '|' || round(ms) FROM timed WHERE label = '$label'");
}

my ($answer, $after, $total) = ended_during_wait('claim-commit', q{timed_claim('claim-commit', 'k-new', '5s')},
	$h1, qq{SELECT idempotency.idem_complete('k-new', $t_new, '{"done": 1}')}, 'COMMIT');
is($answer, 'completed COMPLETED {"done": 1}', 'the creator commits a completion: the waiter replays it');
cmp_ok($after, '<', $slack_ms, "... at once ($after ms after the commit, $total ms in all)");

($answer, $after, $total) = ended_during_wait('late-commit', q{timed_claim('late-commit', 'k-late', '5s')},
	$h3, '', 'COMMIT');
is($answer, 'completed COMPLETED {"late": 1}', 'the late completion commits: the waiter replays it');
cmp_ok($after, '<', $slack_ms, "... at once ($after ms after the commit, $total ms in all)");

($answer, $after, $total) = ended_during_wait('retry-rollback', q{timed_claim('retry-rollback', 'k-retry', '5s')},
	$h2, '', 'ROLLBACK');
like($answer, qr/^claimed PROCESSING/, 'the claim of the due retry rolls back: the waiter claims it');
cmp_ok($after, '<', $slack_ms, "... at once ($after ms after the rollback, $total ms in all)");

($answer, $after, $total) = ended_during_wait('lock-rollback', q{timed_lock('lock-rollback', 'r-new', '5s')},
	$h4, '', 'ROLLBACK');
is($answer, 'token', 'the lock taken by another transaction rolls back: the waiter takes it');
cmp_ok($after, '<', $slack_ms, "... at once ($after ms after the rollback, $total ms in all)");

($answer, $after, $total) = ended_during_wait('unlock-commit', q{timed_lock('unlock-commit', 'r-row', '5s')},
	$h5, '', 'COMMIT');
is($answer, 'token', 'the release of the expired lock commits: the waiter takes it');
cmp_ok($after, '<', $slack_ms, "... at once ($after ms after the commit, $total ms in all)");

$node->stop;
done_testing();
