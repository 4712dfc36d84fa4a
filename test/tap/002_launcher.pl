# The launcher finds the databases by itself: a new database with the
# extension is served within launcher_naptime, a worker comes only while
# something is due there (leases ending), DROP EXTENSION stops the work
# there and CREATE EXTENSION resumes it; idempotency.worker_enabled = off
# (ALTER SYSTEM + reload, i.e. SIGHUP) stops the expiry, on resumes it; a
# reloaded naptime spaces the workers of a busy database out.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $launcher_naptime = 1.0;    # seconds, as idem_node sets it
my $margin = 3.0;

my $node = idem_node('launcher');
isnt(wait_for_backend($node, 'idempotency launcher', undef, 10), '', 'the launcher runs');

# Creates the extension in DB and claims a key with a 100 ms lease in the
# same session; returns the seconds from CREATE EXTENSION to the worker's
# expiry of that lease (server clocks), or undef when it did not happen
# within launcher_naptime + margin.
sub served_after_create_extension
{
	my ($db, $key) = @_;
	my $t0 = $node->safe_psql(
		$db, qq{
CREATE EXTENSION idempotency;
SELECT extract(epoch FROM clock_timestamp());
SELECT 1 FROM idempotency.idem_claim('$key', NULL, '100 milliseconds');});
	($t0) = split /\n/, $t0;
	my $ok = poll_until(
		$launcher_naptime + $margin,
		sub {
			my $row = key_row($node, $db, $key);
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		});
	return undef unless $ok;
	return $node->safe_psql($db,
		"SELECT extract(epoch FROM updated_at) - $t0 FROM idempotency.idempotency_keys WHERE key = '$key'");
}

# Transactions committed in DB over SECONDS: nothing but the workers runs
# there, so this is how often they come (read from another database).
sub worker_transactions
{
	my ($db, $seconds) = @_;
	my $q = "SELECT pg_stat_force_next_flush(); SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$db'";
	my $before = (split /\n/, $node->safe_psql('postgres', $q))[-1];
	usleep($seconds * 1_000_000);
	my $after = (split /\n/, $node->safe_psql('postgres', $q))[-1];
	return $after - $before;
}

# Claims COUNT keys in DB whose leases end one every 100 ms from now: work
# due for COUNT / 10 seconds.
my $batches = 0;
sub leases_ending
{
	my ($db, $count) = @_;
	$batches++;
	$node->safe_psql($db,
		"SELECT count(*) FROM generate_series(1, $count) g, "
		  . "idempotency.idem_claim('ending-$batches-' || g, NULL, make_interval(secs => g / 10.0))");
}

# --- a new database with the extension ---------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
my $fresh = served_after_create_extension('fresh', 'k-fresh');
ok(defined $fresh, 'a database created with the extension is served without configuration');
diag(sprintf('new database: CREATE EXTENSION -> first expiry by its worker: %s (launcher_naptime 1s)',
		fmt_ms($fresh // 99)));
cmp_ok($fresh // 99, '<', $launcher_naptime + $margin, 'within launcher_naptime + margin');

# --- an existing database that gets the extension later -----------------------
$node->safe_psql('postgres', 'CREATE DATABASE later');
sleep(2);    # the launcher has probed it and found no extension
my $later = served_after_create_extension('later', 'k-later');
ok(defined $later, 'an existing database is served once it gets the extension');
diag(sprintf('existing database: CREATE EXTENSION -> first expiry: %s', fmt_ms($later // 99)));
cmp_ok($later // 99, '<', $launcher_naptime + $margin, 'within launcher_naptime + margin');

# --- workers come while something is due, and only then -----------------------
# A sweep is at least six transactions (the check for the extension, four
# lease tasks, the read of what is due next).
sleep(1);    # the sweeps that followed the expiry above are over
my $idle = worker_transactions('later', 2);
note("transactions of the workers in 2 s with the extension and nothing due: $idle");
cmp_ok($idle, '<', 6, 'with the extension and nothing due, no worker sweeps');
leases_ending('later', 30);
my $with = worker_transactions('later', 2);
note("transactions of the workers in 2 s while a lease ends every 100 ms: $with");
cmp_ok($with, '>=', 10, 'while leases end, a worker sweeps about every naptime');
sleep(2);    # the last of those leases has ended

# --- DROP EXTENSION stops the work, CREATE EXTENSION resumes it --------------

$node->safe_psql('later', 'DROP EXTENSION idempotency');
sleep(1);
my $log_offset = -s $node->logfile;
my $without = worker_transactions('later', 3);
note("transactions of the workers in 3 s without the extension: $without");
# At most a look after DROP EXTENSION's catalog changes (a connection and a
# catalog lookup); with the extension and leases ending, a sweep per naptime.
cmp_ok($without, '<=', 15, 'after DROP EXTENSION no sweep remains');
cmp_ok($without, '<', $with, 'far less work than with the extension');
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/background worker "idempotency \w+" \(PID \d+\) exited with exit code [1-9]/,
	'no worker error in a database without the extension');

my $again = served_after_create_extension('later', 'k-again');
ok(defined $again, 'CREATE EXTENSION again resumes the work');
diag(sprintf('CREATE EXTENSION again -> first expiry: %s', fmt_ms($again // 99)));

# --- worker_enabled = off stops the expiry, on resumes it (SIGHUP) ------------
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.worker_enabled = off');
$node->reload;
sleep(1);    # workers started before the reload finish their sweep
like($node->safe_psql('later', claim_sql('k-off', '200 milliseconds')),
	qr/^claimed/, 'claimed with a 200 ms lease while the workers are off');
is(wait_for_backend($node, 'idempotency worker', undef, 2), '', 'no worker runs while worker_enabled = off');
my $row = key_row($node, 'later', 'k-off');
is($row->{status}, 'PROCESSING', 'the lease ran out 2 s ago but nothing expired it');
ok($row->{lease_over}, 'its lease is indeed over');
isnt(backend_pid($node, 'idempotency launcher'), '', 'the launcher itself stays');

$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.worker_enabled = on');
my $t_on = time;
$node->reload;
my $resumed = poll_until(
	5,
	sub {
		my $r = key_row($node, 'later', 'k-off');
		$r && $r->{status} eq 'FAILED_RETRYABLE';
	});
ok($resumed, 'worker_enabled = on: the overdue lease is expired');
diag(sprintf('reload with worker_enabled = on -> expiry seen: %s', fmt_ms(time - $t_on)))
  if $resumed;
is(key_row($node, 'fresh', 'k-fresh')->{status}, 'FAILED_RETRYABLE', 'the other database is untouched');

# --- other settings reload too: naptime ---------------------------------------
# Leases end every 100 ms while the workers are counted: at most one worker
# per naptime serves them.
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.naptime = '2s'");
$node->reload;
sleep(1);
leases_ending('fresh', 50);
my $slow = worker_transactions('fresh', 4);
note("transactions of the workers in 4 s with naptime = 2s: $slow");
cmp_ok($slow, '<=', 40, 'a reloaded naptime of 2s spaces the sweeps out');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET idempotency.naptime');
$node->reload;
sleep(1);
leases_ending('fresh', 30);
my $fast = worker_transactions('fresh', 2);
note("transactions of the workers in 2 s with naptime back to 200ms: $fast");
cmp_ok($fast, '>', 2 * $slow, 'and resetting it brings them back');

$log = slurp_file($node->logfile);
unlike($log, qr/server process .* was terminated/, 'no backend crashed');
$node->stop;
done_testing();
