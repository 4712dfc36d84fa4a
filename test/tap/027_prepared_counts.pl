# The counts behind idem_stats and outbox_lag follow a prepared transaction
# across a server restart: its changes waited in shared memory, which the
# restart lost, so while it lives the counts are unknown (NULL) rather than
# wrong; once COMMIT PREPARED has committed it (or ROLLBACK PREPARED has
# dropped it) a recount makes them exact. Without a restart, COMMIT PREPARED
# in another session applies the changes and ROLLBACK PREPARED drops them.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('prepared', conf => [ 'max_prepared_transactions = 4' ]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $counts = q{
SELECT coalesce((SELECT completed::text FROM idempotency.idem_stats WHERE scope = 'p'), 'none') || ' ' ||
       coalesce((SELECT pending::text FROM idempotency.outbox_lag WHERE topic = 'p'), 'none')};
# Unknown counts: key_counts() has no rows (not even the total's).
my $unknown = q{SELECT count(*) = 0 FROM idempotency.key_counts()};

# One completed key and one pending event, committed.
$node->safe_psql('postgres', q{
SELECT idempotency.idem_complete('k0', (idempotency.idem_claim('k0', scope => 'p')).token, scope => 'p');
SELECT idempotency.outbox_enqueue('p', '{}', 'k');});
ok(poll_until(30, sub { $node->safe_psql('postgres', $counts) eq '1 1' }), 'the committed work is counted');

# Prepared in one session, committed or rolled back from another.
my $prepare = sub {
	my ($name, $key) = @_;
	$node->safe_psql('postgres', qq{
SET idempotency.outbox_notify = off;
BEGIN;
SELECT idempotency.idem_complete('$key', (idempotency.idem_claim('$key', scope => 'p')).token, scope => 'p');
SELECT idempotency.outbox_enqueue('p', '{}', '$key');
PREPARE TRANSACTION '$name';});
};
$prepare->('a', 'k1');
$prepare->('b', 'k2');
is($node->safe_psql('postgres', $counts), '1 1', 'prepared work is not counted before it commits');
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'a'});
is($node->safe_psql('postgres', $counts), '1 1', 'a rolled-back prepared transaction is never counted');
$node->safe_psql('postgres', q{COMMIT PREPARED 'b'});
is($node->safe_psql('postgres', $counts), '2 2', 'COMMIT PREPARED in another session counts it');

# Prepared before a restart: its changes are not in shared memory any more.
$prepare->('c', 'k3');
$node->restart;
is($node->safe_psql('postgres', $unknown), 't',
	'after the restart, with the prepared transaction alive, the counts are unknown');
is($node->safe_psql('postgres', $counts), 'none none', '... the views show no figure');
# The worker tries to recount each naptime (200 ms here): still unknown.
$node->safe_psql('postgres', 'SELECT pg_sleep(1)');
is($node->safe_psql('postgres', $unknown), 't', '... and they stay unknown while it lives');
$node->safe_psql('postgres', q{COMMIT PREPARED 'c'});
ok(poll_until(30, sub { $node->safe_psql('postgres', $counts) eq '3 3' }),
	'once it has committed they are exact: 3 completed keys, 3 pending events');
# Commits keep them so.
$node->safe_psql('postgres',
	q{SELECT idempotency.idem_complete('k4', (idempotency.idem_claim('k4', scope => 'p')).token, scope => 'p')});
is($node->safe_psql('postgres', $counts), '4 3', 'and commits keep them exact');

$node->stop;
done_testing();
