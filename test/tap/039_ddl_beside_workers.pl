# A command that changes the extension's tables in an order of its own
# (ALTER EXTENSION ... UPDATE alters the outbox before the keys table)
# never deadlocks with a background worker: a worker takes the tables it
# needs without waiting, and comes back a naptime later when a command
# holds one of them.
#
# Here a DBA's transaction holds the outbox exclusively while a lease ends.
# The worker expires the lease (the keys table is free) and never waits for
# the outbox; the transaction then takes the keys table as well, as the
# update does, without a deadlock, and once it has committed the worker
# expires the next lease. The same with the tombstones held while a
# finished key's result passes its retention: the purge, which writes both
# tables, waits for the command without holding the keys table.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# A short deadlock_timeout: a deadlock, if any, is found at once.
my $node = idem_node('ddl', conf => ['deadlock_timeout = 100ms']);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub status
{
	return $node->safe_psql('postgres',
		"SELECT status FROM idempotency.idempotency_keys WHERE key = '$_[0]'");
}

# The tables a background worker waits for, looked at for up to SECONDS:
# '' when none of its visits waited.
sub worker_waits
{
	my ($seconds) = @_;
	my $waiting = '';
	poll_until(
		$seconds,
		sub {
			$waiting = $node->safe_psql(
				'postgres', q{
SELECT string_agg(l.relation::regclass::text, ', ')
  FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE NOT l.granted AND a.backend_type = 'idempotency worker'});
			$waiting ne '';
		});
	return $waiting;
}

my $dba = $node->background_psql('postgres');
$dba->query_safe('BEGIN');
$dba->query_safe('LOCK TABLE idempotency.outbox IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', "SELECT idempotency.idem_claim('ddl-1', lease => '1 second')");
ok(poll_until(30, sub { status('ddl-1') eq 'FAILED_RETRYABLE' }),
	'the worker expires a lease while a command holds the outbox');

# The worker comes back every naptime (200 ms) while the outbox is held:
# for 3 s, none of its visits waits for a lock.
is(worker_waits(3), '', 'no worker waits for a table the command holds');

# As the update goes on to the keys table.
eval {
	$dba->query_safe('LOCK TABLE idempotency.idempotency_keys IN ACCESS EXCLUSIVE MODE');
	$dba->query_safe('COMMIT');
};
is($@, '', 'the command then takes the keys table and commits');
$dba->quit;

$node->safe_psql('postgres', "SELECT idempotency.idem_claim('ddl-2', lease => '1 second')");
ok(poll_until(30, sub { status('ddl-2') eq 'FAILED_RETRYABLE' }),
	'once it has committed, the worker expires the next lease');

# A purge writes another table than its own: a purged key leaves its
# tombstone. With the tombstones held when the key's result passes its
# retention, the purge waits for the command's commit, and does not hold
# the keys table meanwhile. (A claim reads the tombstones: the key is
# finished before the command starts.)
$node->safe_psql(
	'postgres', q{
SELECT idempotency.idem_complete('ddl-3', (SELECT token FROM idempotency.idem_claim('ddl-3')),
                                 '{"ok": true}', retain => '2 seconds', retain_key => '1 day')});
$dba = $node->background_psql('postgres');
$dba->query_safe('BEGIN');
$dba->query_safe('LOCK TABLE idempotency.key_tombstones IN ACCESS EXCLUSIVE MODE');
# The result's retention ends 2 s after the complete, and a purge follows
# within a purge naptime (1 s): 6 s of looking cover it.
is(worker_waits(6), '', 'no worker waits for the tombstones the command holds');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'ddl-3'"),
	'1', 'the key is not purged while they are held');
eval {
	$dba->query_safe('LOCK TABLE idempotency.idempotency_keys IN ACCESS EXCLUSIVE MODE');
	$dba->query_safe('COMMIT');
};
is($@, '', 'the command then takes the keys table and commits');
$dba->quit;
ok( poll_until(
		30,
		sub {
			$node->safe_psql('postgres',
				"SELECT result_expired FROM idempotency.idem_get('ddl-3')") eq 't';
		}),
	'once it has committed, the key is purged into its tombstone');

my @deadlocks = slurp_file($node->logfile) =~ /^.*deadlock detected.*$/mg;
is_deeply(\@deadlocks, [], 'no deadlock in the server log');

$node->stop;
done_testing();
