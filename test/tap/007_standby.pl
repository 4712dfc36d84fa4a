# A streaming standby runs no idempotency launcher (the workers do nothing
# on a hot standby) and its data is read-only; after promotion the launcher
# starts there and leases expire.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $primary = idem_node('primary', allows_streaming => 1);
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok(wait_served($primary, 'postgres'), 'the primary is served');
$primary->safe_psql(
	'postgres', q{
SELECT idempotency.idem_complete('done', (idempotency.idem_claim('done')).token, '{"ok": true}');
SELECT idempotency.outbox_enqueue('t', '{"e": 1}');});
$primary->backup('backup');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;

$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');

# --- the standby: no launcher, no workers, read-only --------------------------------
is(wait_for_backend($standby, 'idempotency launcher', undef, 2), '', 'no idempotency launcher on the standby');
is(wait_for_backend($standby, 'idempotency worker', undef, 1), '', 'no idempotency worker on the standby');
is($standby->safe_psql('postgres', q{SELECT (idempotency.idem_get('done')).status}),
	'COMPLETED', 'idem_get reads on the standby');
my ($rc, $out, $err) = $standby->psql('postgres', claim_sql('on-standby', '1 minute'));
isnt($rc, 0, 'idem_claim fails on the standby');
like($err, qr/read-only transaction|recovery/, '... because the standby is read-only');
($rc, $out, $err) = $standby->psql('postgres',
	q{SELECT idempotency.idem_complete('done', 1, '{}')});
isnt($rc, 0, 'idem_complete fails on the standby');
($rc, $out, $err) = $standby->psql('postgres', q{SELECT count(*) FROM idempotency.outbox_claim('r', 10)});
isnt($rc, 0, 'outbox_claim fails on the standby');

# A claim with a lease that ends while only the standby could see it: the
# primary stops at once.
# (6 s: the primary's workers must not expire it before the stop, even on
# a busy machine.)
like($primary->safe_psql('postgres', claim_sql('held', '6 seconds')),
	qr/^claimed/, 'claimed on the primary with a 6 s lease');
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
is($standby->safe_psql('postgres', q{SELECT status FROM idempotency.idempotency_keys WHERE key = 'held'}),
	'PROCESSING', 'the claim replicated; PROCESSING on the standby');
ok(poll_until(30, sub { key_row($standby, 'postgres', 'held')->{lease_over} }), 'its lease has ended');
usleep(500_000);  # a sweep's naptime and more, had one run on the standby
my $held = key_row($standby, 'postgres', 'held');
is($held->{status}, 'PROCESSING', 'but nothing expires it on the standby');

# --- promotion --------------------------------------------------------------------
$standby->promote;
my $t = time;
my $launcher = wait_for_backend($standby, 'idempotency launcher', undef, 15);
isnt($launcher, '', 'after promotion the launcher runs');
diag(sprintf('promotion -> launcher running: %s', fmt_ms(time - $t)));
ok( poll_until(
		15,
		sub {
			my $row = key_row($standby, 'postgres', 'held');
			$row && $row->{status} eq 'FAILED_RETRYABLE';
		}),
	'the lease that ended during the failover is expired by the new primary');
is(key_row($standby, 'postgres', 'held')->{last_error}, 'lease expired', "last_error 'lease expired'");
like($standby->safe_psql('postgres', claim_sql('after-promotion', '200 milliseconds')),
	qr/^claimed/, 'claims work on the promoted standby');
my $waited = poll_until(
	5,
	sub {
		my $row = key_row($standby, 'postgres', 'after-promotion');
		$row && $row->{status} eq 'FAILED_RETRYABLE';
	});
ok($waited, 'and its leases expire there');
my $late = $standby->safe_psql('postgres',
	q{SELECT round(extract(epoch FROM updated_at - (claimed_at + interval '200 milliseconds')) * 1000)
	    FROM idempotency.idempotency_keys WHERE key = 'after-promotion'});
diag("promoted standby: lease end -> expiry: $late ms");
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_claim('r', 10)}),
	'1', 'the outbox is served by the new primary');

$standby->stop;
done_testing();
