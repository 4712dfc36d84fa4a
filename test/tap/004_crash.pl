# Crashes and signals: a kill -9 of a worker or of the launcher makes the
# postmaster restart every backend; the cluster comes back, the launcher is
# back and the work goes on. A SIGTERM ends a worker promptly and ends the
# launcher, which the postmaster restarts, without touching other sessions.
# A worker that fails logs it and the next one retries. A relay killed while
# it holds claimed events leaves them pending.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = idem_node('crash', conf => ["idempotency.purge_batch = 100"]);
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
-- Each purge batch takes 50 ms: a sweep with work to do lives long enough
-- to be signalled.
CREATE FUNCTION public.slow_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_catalog.pg_sleep(0.05); RETURN NULL; END $$;
CREATE TRIGGER slow_batch AFTER DELETE ON idempotency.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION public.slow_batch();});

# N expired keys for the worker to purge (N/100 batches of 50 ms).
sub load_purge
{
	my ($n, $tag) = @_;
	$node->safe_psql(
		'postgres', qq{
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at,
   purge_at)
SELECT 'purge', '$tag-' || g, 'COMPLETED', g, 1, '{}', now(), now(), now(), now() - interval '1 minute',
       now() - interval '1 minute'
  FROM generate_series(1, $n) g;});
}

sub purge_left
{
	my ($rc, $out) = $node->psql('postgres',
		q{SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'purge'});
	return $rc == 0 ? $out : -1;
}

# Claims KEY with a 200 ms lease and waits for a worker to expire it.
sub work_goes_on
{
	my ($key, $what) = @_;
	$node->safe_psql('postgres', claim_sql($key, '200 milliseconds'));
	my $waited = poll_until(
		10,
		sub {
			my $row = key_row($node, 'postgres', $key);
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		});
	ok($waited, "$what: leases expire again");
	return $waited;
}

# Sends SIGNAL to a backend of TYPE while it runs; retries while the pid it
# found has already exited (a worker lives only for its sweep).
sub signal_backend
{
	my ($signal, $type, $db) = @_;
	for (1 .. 20)
	{
		my $pid = wait_for_backend($node, $type, $db, 5);
		next if $pid eq '';
		return $pid if kill($signal, $pid) == 1;
	}
	return '';
}

sub crash_restart_count
{
	my $log = slurp_file($node->logfile);
	my @restarts = $log =~ /all server processes terminated; reinitializing/g;
	return scalar @restarts;
}

my $launcher = wait_for_backend($node, 'idempotency launcher', undef, 10);
isnt($launcher, '', 'the launcher runs');

# --- SIGTERM ends a busy worker promptly ---------------------------------------
my $session = $node->background_psql('postgres');
my $session_pid = $session->query_safe('SELECT pg_backend_pid()');
load_purge(3000, 'term');
ok(poll_until(5, sub { purge_left() < 3000 }), 'a long purge is under way');
my $worker = signal_backend('TERM', 'idempotency worker', 'postgres');
isnt($worker, '', "SIGTERM sent to worker $worker");
my $t = time;
my $gone = poll_until(5, sub { !kill(0, $worker) }, 10);
ok($gone, 'the worker exited');
diag(sprintf('worker exit after SIGTERM (mid-sweep): %s', fmt_ms(time - $t)));
cmp_ok(time - $t, '<', 2, 'promptly');
is($session->query_safe('SELECT pg_backend_pid()'), $session_pid,
	'other sessions are untouched (no crash restart)');
ok(poll_until(30, sub { purge_left() == 0 }), 'the next workers finish the purge');

# --- SIGTERM of the launcher: the postmaster restarts it ------------------------
$launcher = backend_pid($node, 'idempotency launcher');
ok(kill('TERM', $launcher), "SIGTERM sent to the launcher $launcher");
$t = time;
my $new_launcher = '';
ok( poll_until(
		15,
		sub {
			$new_launcher = backend_pid($node, 'idempotency launcher');
			$new_launcher ne '' && $new_launcher ne $launcher;
		},
		100),
	'the postmaster restarted the launcher');
diag(sprintf('launcher back after SIGTERM: %s (bgw_restart_time 5 s)', fmt_ms(time - $t)));
is($session->query_safe('SELECT pg_backend_pid()'), $session_pid,
	'other sessions are untouched by the launcher exiting');
work_goes_on('after-launcher-term', 'launcher restarted after SIGTERM');
$session->quit;
is(crash_restart_count(), 0, 'no crash restart so far');

# --- kill -9 of a busy worker -----------------------------------------------------
load_purge(3000, 'kill');
ok(poll_until(5, sub { purge_left() < 3000 }), 'a long purge is under way');
$worker = signal_backend('KILL', 'idempotency worker', 'postgres');
isnt($worker, '', "kill -9 sent to worker $worker");
$t = time;
ok(poll_until(30, sub { crash_restart_count() == 1 }), 'the postmaster restarts all backends');
ok(wait_until_up($node, 60), 'the cluster accepts connections again');
$launcher = wait_for_backend($node, 'idempotency launcher', undef, 10);
isnt($launcher, '', 'the launcher is back');
diag(sprintf('kill -9 of a worker -> cluster up with a launcher: %s', fmt_ms(time - $t)));
work_goes_on('after-worker-kill', 'after a worker was killed');
ok(poll_until(30, sub { purge_left() == 0 }), 'the purge interrupted by the crash completes');

# --- kill -9 of the launcher --------------------------------------------------------
ok(kill('KILL', $launcher), "kill -9 sent to the launcher $launcher");
$t = time;
ok(poll_until(30, sub { crash_restart_count() == 2 }), 'the postmaster restarts all backends');
ok(wait_until_up($node, 60), 'the cluster accepts connections again');
$new_launcher = wait_for_backend($node, 'idempotency launcher', undef, 10);
isnt($new_launcher, '', 'a new launcher runs');
isnt($new_launcher, $launcher, 'it is a new process');
diag(sprintf('kill -9 of the launcher -> cluster up with a launcher: %s', fmt_ms(time - $t)));
work_goes_on('after-launcher-kill', 'after the launcher was killed');

# --- kill -9 of a relay holding claims in an open transaction -------------------
# A claim is written only when its transaction commits: the crash leaves the
# events as they were before the claim (and before an ack of one of them).
$node->safe_psql('postgres',
	q{SELECT idempotency.outbox_enqueue('crash', jsonb_build_object('n', n), 'k' || n)
	    FROM generate_series(1, 3) n});
my $relay = $node->background_psql('postgres');
my $relay_pid = $relay->query_safe('SELECT pg_backend_pid()');
$relay->query_safe('BEGIN');
is( $relay->query_safe(
		q{SELECT count(*) FROM idempotency.outbox_claim('crash-relay', 10, topics => '{crash}')}),
	'3',
	'a relay holds three claimed events in an open transaction');
is( $relay->query_safe(
		q{SELECT idempotency.outbox_ack(ARRAY(
		    SELECT id FROM idempotency.outbox WHERE topic = 'crash' AND key = 'k1'))}),
	'1',
	'and has acked one of them');
ok(kill('KILL', $relay_pid), "kill -9 of the relay's backend $relay_pid");
eval { $relay->quit; };
ok(poll_until(30, sub { crash_restart_count() == 3 }), 'the postmaster restarts all backends');
ok(wait_until_up($node, 60), 'the cluster accepts connections again');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(key || ' ' || state || ' ' || attempts, ', ' ORDER BY id)
		    FROM idempotency.outbox WHERE topic = 'crash'}),
	'k1 pending 0, k2 pending 0, k3 pending 0',
	'the events are pending, never handed out as far as the table knows');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(attempt::text, ',' ORDER BY id)
		    FROM idempotency.outbox_claim('crash-relay-2', 10, topics => '{crash}')}),
	'1,1,1',
	'and the next claim hands them out at once, attempt 1');

# --- a worker that fails logs it, and the next one retries ------------------------
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.fail_purge (on_ bool);
INSERT INTO public.fail_purge VALUES (true);
CREATE FUNCTION public.failing_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT on_ FROM public.fail_purge) THEN RAISE EXCEPTION 'purge sabotaged by the test'; END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER failing_batch AFTER DELETE ON idempotency.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION public.failing_batch();});
my $offset = -s $node->logfile;
load_purge(50, 'fail');
ok( poll_until(
		10,
		sub {
			my @failures = slurp_file($node->logfile, $offset) =~ /purge sabotaged by the test/g;
			@failures >= 3;
		}),
	'a failing worker logs its error, and the next ones retry');
is(purge_left(), 50, 'nothing purged while the purge fails');
work_goes_on('during-failures', 'while the purge fails');    # expiry runs before the purge
$node->safe_psql('postgres', 'UPDATE public.fail_purge SET on_ = false');
ok(poll_until(10, sub { purge_left() == 0 }), 'once the cause is gone, the purge completes');
is(crash_restart_count(), 3, 'worker errors never crash the cluster');
isnt(backend_pid($node, 'idempotency launcher'), '', 'the launcher survived the failing workers');

$node->stop;
done_testing();
