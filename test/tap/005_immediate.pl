# Immediate shutdown (no checkpoint, crash recovery at the next start) with
# claims, completions and outbox events in flight: no committed completion is
# lost, each key in flight is expired by the first sweep after its lease end
# (or after the restart, for a lease that ended while the server was down),
# and outbox events that were in flight come back to pending and
# are claimable.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = idem_node('immediate', conf => [ "log_statement = none", "log_min_messages = debug1" ]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $dir = PostgreSQL::Test::Utils::tempdir();

# Completions acknowledged before the crash, from one session.
$node->safe_psql(
	'postgres', q{
SELECT count(*) FROM generate_series(1, 50) g,
  LATERAL idempotency.idem_complete('before-' || g,
    (idempotency.idem_claim('before-' || g)).token, jsonb_build_object('n', g)) c;});

# Loops of one psql per call, each writing the call's number to a file once
# psql returned success (so the commit was acknowledged); they stop at the
# first failure, when the server goes down.
my ($host, $port) = ($node->host, $node->port);
sub start_loop
{
	my ($name, $sql) = @_;
	my $script = qq{
i=0
while [ \$i -lt 100000 ]; do
  i=\$((i+1))
  psql -XAtq -h '$host' -p $port -d postgres -v ON_ERROR_STOP=1 -c "\$(printf '%s' "$sql" | sed "s/{i}/\$i/g")" >/dev/null 2>&1 || exit 0
  echo \$i >> '$dir/$name'
done};
	return IPC::Run::start([ 'bash', '-c', $script ], IPC::Run::timeout(120));
}
my @loops = (
	start_loop('completed',
		q{SELECT idempotency.idem_complete('done-{i}', (idempotency.idem_claim('done-{i}')).token, '{\"n\": {i}}')}),
	start_loop('claimed', q{SELECT idempotency.idem_claim('held-{i}', NULL, '2 seconds')}),
	start_loop('enqueued',
		q{SELECT idempotency.outbox_enqueue('t', '{\"n\": {i}}'); SELECT count(*) FROM idempotency.outbox_claim('relay-1', 1, '2 seconds')}),
);

# An open transaction that claimed and completed, not committed.
my $open = $node->background_psql('postgres', on_error_stop => 0);
$open->query_safe(
	q{BEGIN; SELECT idempotency.idem_complete('uncommitted', (idempotency.idem_claim('uncommitted')).token, '{}')});

# Let the loops run, then crash.
ok( poll_until(
		60,
		sub {
			my $n = 0;
			for my $f ('completed', 'claimed', 'enqueued')
			{
				$n++ if -s "$dir/$f" && (split /\n/, slurp_file("$dir/$f"))[-1] >= 30;
			}
			$n == 3;
		}),
	'the loops are running');
$node->stop('immediate');
for my $loop (@loops)
{
	eval { $loop->finish; };
}
eval { $open->quit; };

sub acked
{
	my ($name) = @_;
	return () unless -e "$dir/$name";
	return grep { /^\d+$/ } split /\n/, slurp_file("$dir/$name");
}
my @completed = acked('completed');
my @claimed = acked('claimed');
my @enqueued = acked('enqueued');
note(sprintf('acknowledged before the crash: %d completions, %d claims, %d enqueues+claims',
		scalar @completed, scalar @claimed, scalar @enqueued));

$node->start;

# --- no committed completion lost -------------------------------------------------
my $values = join(',', map { "('done-$_', $_)" } @completed);
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM (VALUES $values) AS v(key, n)
  LEFT JOIN idempotency.idempotency_keys k ON k.scope = 'default' AND k.key = v.key
 WHERE k.status IS DISTINCT FROM 'COMPLETED' OR k.result IS DISTINCT FROM jsonb_build_object('n', v.n)}),
	'0',
	sprintf('all %d completions acknowledged during the crash are COMPLETED with their result',
		scalar @completed));
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM idempotency.idempotency_keys
 WHERE key LIKE 'before-%' AND status = 'COMPLETED'
   AND result = jsonb_build_object('n', substr(key, 8)::int)}),
	'50',
	'the 50 completions made before are COMPLETED with their result');
is(key_row($node, 'postgres', 'uncommitted'), undef, 'the uncommitted claim and completion left nothing');
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'done-1' AND status = 'COMPLETED'}),
	'1', 'the loop did complete keys');

# --- each key in flight expired by the first sweep after its lease end ------------
my $cleared = poll_until(
	60,
	sub {
		$node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.idempotency_keys WHERE status = 'PROCESSING'}) eq '0';
	});
ok($cleared, 'every claim in flight at the crash was expired after the restart');
# A claim's expiry was due at its lease end (claimed_at plus the 2 s lease:
# the expiry clears lease_until) or, when the lease ended while
# the server was down, once the restarted server opened (crash recovery
# done, the workers able to start): the last "ready to accept connections"
# of the log. The sweep that expires it is the first the launcher started
# in the database after that (its DEBUG1 line): the key must be expired
# before the launcher started another sweep there. Checked against the
# sweeps' own starts, not a clock bound, so that a busy machine, which
# delays every start, cannot fail it; the delays are printed.
my $log = slurp_file($node->logfile);
my $stamp = qr/(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+) \[\d+\]/;
my @opened = $log =~ /^$stamp LOG:  database system is ready to accept connections/mg;
ok(@opened >= 2, 'the log shows the first start and the restart');
my $database = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'postgres'});
my @sweeps;
push @sweeps, $1 while $log =~ /^$stamp DEBUG:  idempotency launcher: worker for database $database: /mg;
my $restart_sweeps = join(',', map { "('$_'::timestamptz)" } @sweeps);
cmp_ok(scalar @sweeps, '>=', 1, 'the log shows the sweeps the launcher started');
my $late = $node->safe_psql(
	'postgres', qq{
WITH held AS (
  SELECT k.updated_at, greatest(k.claimed_at + interval '2 seconds', '$opened[-1]'::timestamptz) AS due,
         k.last_error = 'lease expired' AND k.status = 'FAILED_RETRYABLE' AS expired
    FROM idempotency.idempotency_keys k WHERE k.key LIKE 'held-%'),
sweeps(started) AS (VALUES $restart_sweeps),
judged AS (
  SELECT h.*,
         (SELECT s.started FROM sweeps s WHERE s.started >= h.due ORDER BY s.started OFFSET 1 LIMIT 1)
           AS second_sweep
    FROM held h WHERE h.updated_at > '$opened[-1]'::timestamptz)
SELECT (SELECT count(*) FROM held) || '|' ||
       (SELECT count(*) FILTER (WHERE expired) FROM held) || '|' ||
       count(*) || '|' ||
       count(*) FILTER (WHERE second_sweep IS NOT NULL AND updated_at > second_sweep) || '|' ||
       coalesce(round(max(extract(epoch FROM updated_at - due) * 1000)), 0) || '|' ||
       coalesce(round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - due) * 1000)), 0)
  FROM judged});
my ($held, $expired_ok, $after_restart, $left_behind, $max_late, $median_late) = split /\|/, $late;
diag(sprintf('claims in flight at the crash: %d, %d of them expired after the restart; '
		  . 'expiry after max(lease end, server open): median %d ms, max %d ms',
		$held, $after_restart, $median_late, $max_late));
cmp_ok($held, '>=', scalar @claimed, 'every acknowledged claim survived the crash');
is($expired_ok, $held, "each is FAILED_RETRYABLE with last_error 'lease expired'");
cmp_ok($after_restart, '>', 0, 'some claims were still in flight at the crash');
is($left_behind, '0',
	'each was expired by the first sweep the launcher started after its lease end (or the restart)');

# --- outbox events in flight come back --------------------------------------------
my $in_flight_back = poll_until(
	60,
	sub {
		$node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.outbox WHERE state = 'in_flight'}) eq '0';
	});
ok($in_flight_back, 'no outbox event stays in flight after its lease');
my $values_e = join(',', map { "($_)" } @enqueued);
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM (VALUES $values_e) AS v(n)
 WHERE NOT EXISTS (SELECT 1 FROM idempotency.outbox o WHERE o.payload = jsonb_build_object('n', v.n))}),
	'0',
	sprintf('all %d acknowledged enqueues survived', scalar @enqueued));
my $total = $node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.outbox');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox WHERE state = 'pending'}),
	$total, 'every event is pending again');
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.outbox_claim('relay-2', 10000, '1 minute')}),
	$total, "all $total events are claimable by another relay");

unlike(slurp_file($node->logfile),
	qr/background worker "idempotency \w+" \(PID \d+\) exited with exit code [1-9]/,
	'no worker error');
$node->stop;
done_testing();
