# The workers never keep DROP DATABASE of a database with the extension from
# succeeding within five seconds, nor DROP EXTENSION (forced with
# idempotency.force_drop, as PROCESSING keys are left): both are run while a
# worker is connected and busy purging, several times, and once while a
# sweep has far more work than five seconds allow.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = idem_node('dropdb', conf => ["log_statement = ddl"]);

# Expired keys the worker will purge, and expired leases it will expire.
sub load_work
{
	my ($db, $purge, $expire) = @_;
	$node->safe_psql(
		$db, qq{
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at,
   purge_at)
SELECT 'load', 'done-' || g || '-' || txid_current(), 'COMPLETED', g, 1, '{}', now(), now(), now(),
       now() - interval '1 minute', now() - interval '1 minute'
  FROM generate_series(1, $purge) g;
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, lease_until, created_at, updated_at, claimed_at,
   active_since)
SELECT 'load', 'held-' || g || '-' || txid_current(), 'PROCESSING', g, 1,
       now() - interval '1 minute', now(), now(), now(), now()
  FROM generate_series(1, $expire) g;});
}

# Runs DDL while a worker is connected to DB; returns (ok, seconds, error,
# whether a worker was connected when the DDL started).
sub ddl_while_worker_runs
{
	my ($db, $ddl_db, $ddl) = @_;
	my $worker = wait_for_backend($node, 'idempotency worker', $db, 5);
	my $start = time;
	my ($rc, $out, $err) = $node->psql($ddl_db, $ddl);
	return ($rc == 0, time - $start, $err, $worker ne '');
}

# --- DROP DATABASE, repeatedly, while workers run ------------------------------
my @drop_times;
for my $i (1 .. 5)
{
	my $db = "dropme_$i";
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	$node->safe_psql($db, claim_sql('served', '100 milliseconds'));
	ok( poll_until(
			5,
			sub {
				my $row = key_row($node, $db, 'served');
				$row && $row->{status} ne 'PROCESSING';
			}),
		"$db: served by a worker");
	load_work($db, 50000, 5000);
	my ($ok, $secs, $err, $busy) = ddl_while_worker_runs($db, 'postgres', "DROP DATABASE $db");
	push @drop_times, $secs;
	ok($ok, "$db: DROP DATABASE succeeded" . ($busy ? ' (a worker was connected)' : ''))
	  or diag($err);
	cmp_ok($secs, '<', 5, "$db: DROP DATABASE within 5 s");
	is($node->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE datname = '$db'"),
		'0', "$db: gone");
}
diag(sprintf('DROP DATABASE with a busy worker: %s',
		join(', ', map { fmt_ms($_) } @drop_times)));

# --- a sweep with more work than five seconds: DROP DATABASE still wins ------
# A statement trigger makes each purge batch take 50 ms: with purge_batch =
# 100, the 20000 expired keys are a sweep of about 10 s.
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.purge_batch = 100');
$node->reload;
$node->safe_psql('postgres', 'CREATE DATABASE bigdrop');
$node->safe_psql(
	'bigdrop', q{
CREATE EXTENSION idempotency;
CREATE FUNCTION public.slow_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_catalog.pg_sleep(0.05); RETURN NULL; END $$;
CREATE TRIGGER slow_batch AFTER DELETE ON idempotency.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION public.slow_batch();});
sleep(1);    # workers started before the reload are gone
load_work('bigdrop', 20000, 0);
my $left_before = 20000;
ok( poll_until(
		5,
		sub {
			$left_before = $node->safe_psql('bigdrop',
				q{SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'load'});
			$left_before < 19000;
		}),
	'a long purge is under way');
note("expired keys left when DROP DATABASE starts: $left_before");
my ($ok, $secs, $err, $busy) = ddl_while_worker_runs('bigdrop', 'postgres', 'DROP DATABASE bigdrop');
ok($ok, 'DROP DATABASE during a long purge succeeded' . ($busy ? ' (a worker was connected)' : ''))
  or diag($err);
diag(sprintf('DROP DATABASE during a long sweep (%d keys left, 50 ms per batch of 100): %s',
		$left_before, fmt_ms($secs)));
cmp_ok($secs, '<', 5, 'within 5 s');
$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS bigdrop');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET idempotency.purge_batch');
$node->reload;

# --- DROP EXTENSION, repeatedly, while workers run -----------------------------
$node->safe_psql('postgres', 'CREATE DATABASE extdb');
my @ext_times;
for my $i (1 .. 3)
{
	$node->safe_psql('extdb', 'CREATE EXTENSION idempotency');
	$node->safe_psql('extdb', claim_sql("served-$i", '100 milliseconds'));
	ok( poll_until(
			5,
			sub {
				my $row = key_row($node, 'extdb', "served-$i");
				$row && $row->{status} ne 'PROCESSING';
			}),
		"round $i: served by a worker");
	load_work('extdb', 50000, 5000);
	# Keys are PROCESSING: a plain DROP EXTENSION is refused, naming the
	# setting that forces it, and the forced one is what is timed. (The
	# worker may expire all 5000 leases of load_work first: one key's lease
	# lasts the test.)
	$node->safe_psql('extdb', claim_sql("live-$i", '1 hour'));
	my ($rc, $out, $refused) = $node->psql('extdb', 'DROP EXTENSION idempotency');
	isnt($rc, 0, "round $i: DROP EXTENSION with PROCESSING keys is refused");
	like($refused, qr/idempotency\.force_drop/, "... its hint names idempotency.force_drop");
	my ($ok, $secs, $err, $busy) = ddl_while_worker_runs('extdb', 'extdb',
		'SET idempotency.force_drop = on; DROP EXTENSION idempotency');
	push @ext_times, $secs;
	ok($ok, "round $i: DROP EXTENSION succeeded" . ($busy ? ' (a worker was connected)' : ''))
	  or diag($err);
	cmp_ok($secs, '<', 5, "round $i: DROP EXTENSION within 5 s");
}
diag(sprintf('DROP EXTENSION with a busy worker: %s', join(', ', map { fmt_ms($_) } @ext_times)));

# The database is still usable and, once the extension is back, served.
$node->safe_psql('extdb', 'CREATE EXTENSION idempotency');
$node->safe_psql('extdb', claim_sql('after', '100 milliseconds'));
ok( poll_until(
		5,
		sub {
			my $row = key_row($node, 'extdb', 'after');
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		}),
	'after the drops, CREATE EXTENSION is served again');
$node->safe_psql('postgres', 'DROP DATABASE extdb');

isnt(backend_pid($node, 'idempotency launcher'), '', 'the launcher is still running');
my $log = slurp_file($node->logfile);
unlike($log, qr/server process .* was terminated/, 'no backend crashed');
my @errors = $log =~ /(\bERROR: [^\n]*)/g;
note("worker errors logged (allowed, the next worker retries): " . scalar(@errors));
note($_) for @errors[ 0 .. ($#errors < 4 ? $#errors : 4) ];
$node->stop;
done_testing();
