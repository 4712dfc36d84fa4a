# Without shared_preload_libraries: CREATE EXTENSION works and so does every
# SQL function (keys, inbox, outbox, locks, maintenance, the views); a caller
# that waits falls back to polling and still sees the holder's release at
# once; only idem_metrics and idem_metrics_reset, which need the shared
# memory, raise 55000 naming shared_preload_libraries.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('no_preload');
$node->init;
$node->append_conf('postgresql.conf', "log_min_messages = info\n");
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'', 'the library is not preloaded');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is( $node->safe_psql(
		'postgres',
		"SELECT extversion = default_version FROM pg_extension, pg_available_extensions "
		  . "WHERE extname = 'idempotency' AND name = extname"),
	't',
	'CREATE EXTENSION works without preload');

# Runs SQL and returns its output; fails the test on an error.
sub query { return $node->safe_psql('postgres', $_[0]); }

# --- keys ------------------------------------------------------------------
is(query("SELECT outcome || ' ' || status FROM idempotency.idem_register('np-1', '{\"a\": 1}', 'job-1')"),
	'registered RECEIVED', 'register');
my $t1 = query("SELECT token FROM idempotency.idem_claim('np-1', '{\"a\": 1}')");
like($t1, qr/^\d+$/, 'claim of a registered key gives a token');
like(query("SELECT idempotency.idem_heartbeat('np-1', $t1, '1 min') > now()"),
	qr/^t$/, 'heartbeat');
is(query("SELECT 'owner' FROM idempotency.idem_assert_owner('np-1', $t1)"), 'owner', 'assert_owner');
is(query("SELECT outcome || ' ' || result FROM idempotency.idem_complete('np-1', $t1, '{\"ok\": 1}')"),
	'completed {"ok": 1}', 'complete');
is(query("SELECT outcome || ' ' || result FROM idempotency.idem_claim('np-1', '{\"a\": 1}')"),
	'completed {"ok": 1}', 'a duplicate claim replays the result');
is(query("SELECT outcome FROM idempotency.idem_register('np-1', '{\"a\": 2}')"),
	'mismatch', 'a different request is a mismatch');
my $t2 = query("SELECT token FROM idempotency.idem_claim('np-2')");
is(query("SELECT idempotency.idem_fail('np-2', $t2, 'boom', retry_in => '0')"),
	'FAILED_RETRYABLE', 'fail (retryable)');
my $t3 = query("SELECT token FROM idempotency.idem_claim('np-2')");
ok($t3 > $t2, 'a retry gets a larger token');
query("SELECT idem_release FROM idempotency.idem_release('np-2', $t3)");
is(query("SELECT idempotency.idem_get('np-2') IS NULL"), 't', 'release removes a key that was not registered');

# A lease that ran out: taken over lazily, or expired by idem_maintenance().
my $t4 = query("SELECT token FROM idempotency.idem_claim('np-3', lease => '100ms')");
query("SELECT idempotency.idem_claim('np-4', lease => '100ms')");
usleep(200_000);
is(query("SELECT outcome || ' ' || attempt FROM idempotency.idem_claim('np-3')"),
	'claimed 2', 'an expired lease is taken over');
my ($rc, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT idempotency.idem_complete('np-3', $t4)");
like($err, qr/ERROR:  IK001/, 'the taken-over token is stale: IK001');
is(query("SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_leases'"),
	'1', 'idem_maintenance() expires a lease');
is(query("SELECT status || ' ' || last_error FROM idempotency.idem_get('np-4')"),
	'FAILED_RETRYABLE lease expired', 'the expired key is FAILED_RETRYABLE');
like(query("SELECT count(*) FROM idempotency.idem_stats"), qr/^\d+$/, 'idem_stats reads');
like(query("SELECT count(*) FROM idempotency.idem_stuck"), qr/^\d+$/, 'idem_stuck reads');

# --- inbox, outbox ------------------------------------------------------------
is(query("SELECT idempotency.inbox_receive('m1', 'np') || ' ' || idempotency.inbox_receive('m1', 'np')"),
	'true false', 'inbox_receive');
my $e1 = query("SELECT idempotency.outbox_enqueue('np.topic', '{\"n\": 1}', 'k', dedup_key => 'd1')");
is(query("SELECT idempotency.outbox_enqueue('np.topic', '{\"n\": 1}', 'k', dedup_key => 'd1')"),
	$e1, 'outbox_enqueue deduplicates');
is(query("SELECT string_agg(id || ' ' || attempt || ' ' || payload, ',') FROM idempotency.outbox_claim('relay')"),
	"$e1 1 {\"n\": 1}", 'outbox_claim hands the event out');
is(query("SELECT idempotency.outbox_ack(ARRAY[$e1])"), '1', 'outbox_ack');
my $e2 = query("SELECT idempotency.outbox_enqueue('np.other', '{\"n\": 2}')");
is(query("SELECT string_agg(id::text, ',') FROM idempotency.outbox_claim('relay')"), $e2,
	'outbox_claim hands out the next event');
is(query("SELECT idempotency.outbox_nack($e2, 'no', retryable => false)"), 'dead', 'outbox_nack');
is(query("SELECT count(*) FROM idempotency.outbox_dead_letters"), '1', 'outbox_dead_letters reads');
is(query("SELECT idempotency.outbox_redrive(ARRAY[$e2])"), '1', 'outbox_redrive');
is(query("SELECT string_agg(id || ' ' || attempt, ',') FROM idempotency.outbox_claim('relay')"),
	"$e2 1", 'a redriven event is handed out again');
like(query("SELECT count(*) FROM idempotency.outbox_lag"), qr/^\d+$/, 'outbox_lag reads');

# --- locks ------------------------------------------------------------------
my $l1 = query("SELECT idempotency.idem_lock('np-res', '1 min', 'a')");
like($l1, qr/^\d+$/, 'idem_lock gives a token');
is(query("SELECT idempotency.idem_lock('np-res') IS NULL"), 't', 'a held lock is refused');
is(query("SELECT idempotency.idem_lock_renew('np-res', $l1)"), 't', 'idem_lock_renew');
is(query("SELECT 'holder' FROM idempotency.idem_lock_assert('np-res', $l1)"), 'holder', 'idem_lock_assert');

# --- waiting: the polling fallback ---------------------------------------------
# A waiter in a session of its own; returns its output once it has finished.
sub start_waiter
{
	my ($sql) = @_;
	my %w = (out => '', err => '');
	$w{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d',
			$node->connstr('postgres') . ' application_name=np_waiter', '-c', $sql ],
		'>', \$w{out}, '2>', \$w{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return \%w;
}

sub finish_waiter
{
	my ($w) = @_;
	$w->{h}->finish;
	is($w->{err}, '', 'the waiter raised nothing');
	chomp $w->{out};
	return $w->{out};
}

# Until the waiter is sleeping in the extension's wait (between two polls).
sub wait_until_sleeping
{
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'np_waiter' "
		  . "AND wait_event_type = 'Extension'");
}

# A lock waiter gets the lock when the holder unlocks (another session).
my $w = start_waiter(
	"SELECT (idempotency.idem_lock('np-res', '1 min', 'b', wait => '10s') IS NOT NULL) "
	  . "|| ' ' || (clock_timestamp() - statement_timestamp() < interval '5s')");
ok(wait_until_sleeping(), 'the lock waiter waits');
usleep(300_000);
is(query("SELECT idempotency.idem_unlock('np-res', $l1)"), 't', 'the holder unlocks');
is(finish_waiter($w), 'true true', 'the waiting idem_lock returns a token well before its wait ends');
my $l2 = query("SELECT token FROM idempotency.locks WHERE resource = 'np-res' AND owner = 'b'");
ok($l2 > $l1, 'with a larger token');

# A claim waiter gets the holder's result when the holder completes.
my $t5 = query("SELECT token FROM idempotency.idem_claim('np-5', lease => '1 min')");
$w = start_waiter(
	"SELECT outcome || ' ' || result || ' ' || (clock_timestamp() - statement_timestamp() < interval '5s') "
	  . "FROM idempotency.idem_claim('np-5', wait => '10s')");
ok(wait_until_sleeping(), 'the claim waiter waits');
usleep(300_000);
query("SELECT idempotency.idem_complete('np-5', $t5, '\"done\"')");
is(finish_waiter($w), 'completed "done" true',
	'the waiting idem_claim replays the result well before its wait ends');

# A claim waiter whose wait ends first answers in_progress.
my $t6 = query("SELECT token FROM idempotency.idem_claim('np-6', lease => '1 min')");
is(query("SELECT outcome || ' ' || (clock_timestamp() - statement_timestamp() >= interval '300ms') "
	  . "FROM idempotency.idem_claim('np-6', wait => '300ms')"),
	'in_progress true', 'a wait that ends first answers in_progress');

# --- the metrics need the shared memory ------------------------------------------
for my $sql ('SELECT * FROM idempotency.idem_metrics',
	'SELECT * FROM idempotency.idem_metrics_row()',
	'SELECT idempotency.idem_metrics_reset()')
{
	($rc, $out, $err) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	isnt($rc, 0, "$sql fails");
	like($err, qr/ERROR:  55000: .*shared_preload_libraries/,
		"$sql raises 55000 naming shared_preload_libraries");
}

# Nothing above took the server down.
is(query('SELECT 1'), '1', 'the server is up');
ok(!$node->log_contains('terminated by signal'), 'no backend crashed');

$node->stop;
done_testing();
