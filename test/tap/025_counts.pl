# The counts behind idem_stats and outbox_lag (kept in shared memory as work
# happens): on a table too large for a read to recount it, a view reads them
# as unknown (NULL) until the background worker has recounted them, after
# idempotency.request_sweep() and after a server restart; then they are
# exact, and commits keep them so; a standby has none.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('counts', allows_streaming => 1);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
# Finished keys loaded directly, as a restore writes them: enough pages
# that a view's read leaves the recount to a worker.
$node->safe_psql('postgres', q{
INSERT INTO idempotency.idempotency_keys
  (scope, key, status, token, attempts, result, created_at, updated_at, completed_at, expires_at, purge_at)
SELECT 'bulk', 'done-' || g, 'COMPLETED', g, 1, jsonb_build_object('padding', repeat('x', 100)),
       now(), now(), now(), now() + interval '1 day', now() + interval '1 day'
  FROM generate_series(1, 100000) g;
INSERT INTO idempotency.outbox (topic, payload, state, attempts, enqueued_at, available_at, delivered_at, updated_at)
SELECT 'bulk', '{}', 'delivered', 1, now(), now(), now() - interval '1 minute', now()
  FROM generate_series(1, 1000) g;
});
my $stats = q{SELECT coalesce(completed::text, 'unknown') FROM idempotency.idem_stats WHERE scope = 'bulk'};
my $delivered = q{SELECT coalesce(pending::text, 'unknown') || ' ' || (last_delivered_at IS NOT NULL)
                    FROM idempotency.outbox_lag WHERE topic = 'bulk'};

# Rows written behind the functions: counted once request_sweep() had the
# worker recount them.
$node->safe_psql('postgres', 'SELECT idempotency.request_sweep()');
ok(poll_until(30, sub { $node->safe_psql('postgres', $stats) eq '100000' }),
	'after request_sweep() the worker recounts: 100000 completed keys');
is($node->safe_psql('postgres', $delivered), '0 true', 'and the outbox: nothing pending, a last delivery known');

# Commits keep the counts: one more completed key, one more pending event.
$node->safe_psql('postgres', q{
SELECT idempotency.idem_complete('new', (idempotency.idem_claim('new', scope => 'bulk')).token, '{}', 'bulk');
SELECT idempotency.outbox_enqueue('bulk', '{}');
});
is($node->safe_psql('postgres', $stats), '100001', 'a complete counts at its commit');
is($node->safe_psql('postgres', $delivered), '1 true', 'an enqueue too');

# A standby: no counts there (nothing keeps them), the live figures exact.
$node->safe_psql('postgres', q{SELECT idempotency.idem_claim('live', lease => '1 hour', scope => 'bulk')});
$node->backup('counted');
my $standby = PostgreSQL::Test::Cluster->new('counts_standby');
$standby->init_from_backup($node, 'counted', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres',
		q{SELECT processing || ' ' || (completed IS NULL) FROM idempotency.idem_stats WHERE scope = 'bulk'}),
	'1 true', 'the standby counts the live keys and reads no counts of finished keys');
is($standby->safe_psql('postgres', q{SELECT pending IS NULL, lag >= '0' FROM idempotency.outbox_lag WHERE topic = 'bulk'}),
	't|t', 'nor of pending events; the lag it reads from the table');
$standby->stop;

# A restart forgets them: unknown until the worker has recounted.
$node->restart;
my $seen_unknown = $node->safe_psql('postgres', $stats) eq 'unknown';
ok(poll_until(30, sub { $node->safe_psql('postgres', $stats) eq '100001' }),
	'after a restart the worker recounts: 100001 completed keys');
note($seen_unknown ? 'the first read after the restart found them unknown'
	: 'the worker had recounted before the first read');
is($node->safe_psql('postgres', $delivered), '1 true', 'the outbox counted again, its last delivery from the table');
$node->safe_psql('postgres', q{SELECT idempotency.idem_release('live', token, 'bulk') FROM idempotency.idempotency_keys WHERE key = 'live'});

$node->stop;
done_testing();
