# The background worker does the maintenance on its own, with nothing calling
# idem_maintenance(): leases expire within about one naptime, attempts
# exhausted give FAILED_FINAL, in-flight outbox events whose lease ran out
# come back to pending, and retention purges keys, delivered outbox events,
# inbox rows and expired locks, in batches of at most purge_batch rows, one
# transaction per batch.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node(
	'workers',
	conf => [
		"idempotency.max_attempts = 2",
		"idempotency.outbox_retention = '2s'",
		"idempotency.inbox_retention = '2s'",
	]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok(wait_served($node, 'postgres'), 'a worker serves the database');

# --- the processes ---------------------------------------------------------
isnt(wait_for_backend($node, 'idempotency launcher', undef, 10),
	'', "the launcher shows in pg_stat_activity as 'idempotency launcher'");
# A worker comes when something is due there: a lease that ends.
$node->safe_psql('postgres', claim_sql('show-worker', '500 milliseconds'));
isnt(wait_for_backend($node, 'idempotency worker', 'postgres', 10),
	'', "a worker shows in pg_stat_activity as 'idempotency worker'");
ok( poll_until(
		10,
		sub {
			my $row = key_row($node, 'postgres', 'show-worker');
			$row && $row->{status} ne 'PROCESSING';
		}),
	'and expires that lease');

my $metrics = sub {
	return $node->safe_psql('postgres',
		'SELECT lease_expirations FROM idempotency.idem_metrics');
};
my $expirations_before = $metrics->();

# --- leases expire within a naptime ------------------------------------------
my @keys = map { "lease-$_" } 1 .. 5;
for my $key (@keys)
{
	like($node->safe_psql('postgres', claim_sql($key, '1 second')),
		qr/^claimed\|\d+$/, "$key claimed with a 1 s lease");
}
ok( poll_until(
		10,
		sub {
			$node->safe_psql('postgres',
				"SELECT count(*) FROM idempotency.idempotency_keys "
				  . "WHERE key LIKE 'lease-%' AND status = 'PROCESSING'") eq '0';
		}),
	'the worker expired every lease (nothing called idem_maintenance)');

# updated_at is the worker's clock at the expiry; the lease ended 1 s after
# the claim (lease_until itself is cleared once the sweep settles the lease).
my @delays = split /\n/, $node->safe_psql(
	'postgres', q{
SELECT round(extract(epoch FROM updated_at - (claimed_at + interval '1 second')) * 1000)
  FROM idempotency.idempotency_keys WHERE key LIKE 'lease-%' ORDER BY key});
diag(sprintf('lease end -> expiry by the worker (naptime 200ms): %s ms',
		join(', ', @delays)));
is(scalar(grep { $_ >= 0 && $_ < 5000 } @delays),
	5, 'each lease expired after its end and within 5 s of it');
for my $key (@keys)
{
	my $row = key_row($node, 'postgres', $key);
	is_deeply(
		[ $row->{status}, $row->{last_error}, $row->{attempts} ],
		[ 'FAILED_RETRYABLE', 'lease expired', 1 ],
		"$key: FAILED_RETRYABLE, 'lease expired', 1 attempt");
}
is($metrics->() - $expirations_before, 5, 'idem_metrics counts the 5 expirations');

# --- attempts exhausted: FAILED_FINAL ----------------------------------------
# max_attempts = 2: the second claim's expiry is final.
like($node->safe_psql('postgres', claim_sql('lease-1', '1 second')),
	qr/^claimed\|/, 'an expired key is claimable again at once (no backoff)');
ok( poll_until(
		10,
		sub {
			my $row = key_row($node, 'postgres', 'lease-1');
			$row && $row->{status} ne 'PROCESSING';
		}),
	'the second lease expired too');
my $final = key_row($node, 'postgres', 'lease-1');
is_deeply(
	[ $final->{status}, $final->{last_error}, $final->{attempts} ],
	[ 'FAILED_FINAL', 'lease expired', 2 ],
	'attempts exhausted: FAILED_FINAL with last_error lease expired');
isnt($final->{expires_at}, '', 'a FAILED_FINAL key gets a retention deadline');

# --- retention -----------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
SELECT idempotency.idem_complete('short', (idempotency.idem_claim('short')).token,
                                 '{"r": 1}', retain => '1 second');
SELECT idempotency.idem_complete('long', (idempotency.idem_claim('long')).token, '{"r": 2}');
SELECT idempotency.inbox_receive('m1', 'src');
SELECT idempotency.idem_lock('res-short', '1 second');
SELECT idempotency.idem_lock('res-long', '1 hour');
SELECT idempotency.outbox_enqueue('t', '{"e": 1}');
SELECT idempotency.outbox_enqueue('t', '{"e": 2}');
});
# Event 1 delivered; event 2 handed out with a 1 s lease and never acked.
$node->safe_psql('postgres',
	q{SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim('relay-a', 1)))});
$node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.outbox_claim('relay-b', 1, '1 second')});
$node->safe_psql('postgres', q{SELECT idempotency.outbox_enqueue('t', '{"e": 3}')});

my %gone = (
	'key past expires_at' =>
	  "SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'short'",
	'delivered outbox event past outbox_retention' =>
	  "SELECT count(*) FROM idempotency.outbox WHERE payload = '{\"e\": 1}'",
	'inbox row past inbox_retention' =>
	  "SELECT count(*) FROM idempotency.inbox WHERE message_id = 'm1'",
	'expired lock' =>
	  "SELECT count(*) FROM idempotency.locks WHERE resource = 'res-short'",);
for my $what (sort keys %gone)
{
	my $waited = poll_until(10,
		sub { $node->safe_psql('postgres', $gone{$what}) eq '0' });
	ok($waited, "retention purged the $what");
}
ok( poll_until(
		10,
		sub {
			$node->safe_psql('postgres',
				q{SELECT state || '/' || attempts FROM idempotency.outbox WHERE payload = '{"e": 2}'})
			  eq 'pending/1';
		}),
	'an in-flight outbox event whose lease ran out is pending again');
is( $node->safe_psql(
		'postgres', q{
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'long') || ',' ||
       (SELECT count(*) FROM idempotency.locks WHERE resource = 'res-long') || ',' ||
       (SELECT count(*) FROM idempotency.outbox WHERE state = 'pending')}),
	'1,1,2',
	'what is not due stays: a retained key, a live lock, pending events');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(payload->>'e', ',' ORDER BY id)
		    FROM idempotency.outbox_claim('relay-c', 10)}),
	'2,3',
	'the expired event is claimable again');

# --- batches of purge_batch rows, one transaction each -------------------------
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.purge_batch = 100');
$node->reload;
# A statement trigger records each maintenance statement: its transaction
# and how many rows it changed.
$node->safe_psql(
	'postgres', q{
CREATE TABLE public.batch_log (xid xid8, op text, n bigint);
CREATE FUNCTION public.log_batch() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public AS $$
BEGIN
  INSERT INTO public.batch_log SELECT pg_current_xact_id(), TG_OP, count(*) FROM old_rows;
  RETURN NULL;
END $$;
});
# Let the workers started before the reload finish.
sleep(1);
$node->safe_psql(
	'postgres', q{
CREATE TRIGGER log_delete AFTER DELETE ON idempotency.idempotency_keys
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION public.log_batch();
CREATE TRIGGER log_update AFTER UPDATE ON idempotency.idempotency_keys
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION public.log_batch();
BEGIN;
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at,
   purge_at)
SELECT 'batch', 'done-' || g, 'COMPLETED', nextval('idempotency.token_seq'), 1, '{}',
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
       now() - interval '1 minute', now() - interval '1 minute'
  FROM generate_series(1, 1000) g;
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, lease_until, created_at, updated_at, claimed_at,
   active_since)
SELECT 'batch', 'held-' || g, 'PROCESSING', nextval('idempotency.token_seq'), 1,
       now() - interval '1 minute', now() - interval '1 hour', now() - interval '1 hour',
       now() - interval '1 hour', now() - interval '1 hour'
  FROM generate_series(1, 1000) g;
COMMIT;
});
my $batch_wait = poll_until(
	20,
	sub {
		$node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.idempotency_keys
			   WHERE scope = 'batch' AND (status = 'PROCESSING' OR key LIKE 'done-%')}) eq '0';
	});
ok($batch_wait, '1000 expired keys purged and 1000 leases expired with purge_batch = 100');
diag(sprintf('1000 purges + 1000 expiries in batches of 100 took %s', fmt_ms($batch_wait // 0)));
$node->safe_psql('postgres',
	'DROP TRIGGER log_delete ON idempotency.idempotency_keys; '
	  . 'DROP TRIGGER log_update ON idempotency.idempotency_keys');
for my $op ('DELETE', 'UPDATE')
{
	my $stats = $node->safe_psql(
		'postgres', qq{
SELECT sum(n) || '|' || max(n) || '|' || count(*) || '|' || count(DISTINCT xid)
  FROM public.batch_log WHERE op = '$op' AND n > 0});
	my ($sum, $max, $statements, $xacts) = split /\|/, $stats;
	note("$op: $sum rows, largest statement $max rows, $statements statements, $xacts transactions");
	# UPDATE: each lease is expired, then settled (filed for retention).
	my $changed = $op eq 'UPDATE' ? 2000 : 1000;
	is($sum, $changed, "$op: $changed rows changed by the worker");
	cmp_ok($max, '<=', 100, "$op: no statement changed more than purge_batch rows");
	cmp_ok($statements, '>=', 10, "$op: at least 10 batches");
	is($xacts, $statements, "$op: each batch in its own transaction");
}
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.idempotency_keys WHERE scope = 'batch' AND status = 'FAILED_RETRYABLE'}),
	'1000',
	'the expired leases are FAILED_RETRYABLE');

# A worker's error ends it with exit code 1, and the postmaster logs that.
my $log = slurp_file($node->logfile);
unlike($log, qr/background worker "idempotency \w+" \(PID \d+\) exited with exit code [1-9]/,
	'no worker or launcher error logged');
unlike($log, qr/server process .* was terminated/, 'no backend crashed');

$node->stop;
done_testing();
