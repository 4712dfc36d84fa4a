# A key that finishes (completed, or failed) is settled by the next sweep,
# a naptime later, even when the last sweep saw no finished key and the
# only lease in the database ends an hour later: the complete or fail
# itself tells the launcher that a sweep is due. Until it did, such a key
# (and every key finished after it) waited for the launcher's look at the
# tables' row changes, once every purge_naptime: under steady traffic the
# live keys' index then held a minute of finished keys, and the views paid
# a heap visit for each. purge_naptime is set far out here, so that only
# the note can bring the sweep in time.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('settle', conf => ["idempotency.purge_naptime = '10min'"]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok(wait_served($node, 'postgres'), 'a worker serves the database');

# No finished key waits, and no worker runs: the last sweep is over and
# found nothing more to settle.
my $unsettled = q{SELECT count(*) FROM idempotency.idempotency_keys
  WHERE active_since IS NOT NULL AND status NOT IN ('RECEIVED', 'PROCESSING')};
ok( poll_until(
		30,
		sub {
			$node->safe_psql('postgres', $unsettled) eq '0'
			  && backend_pid($node, 'idempotency worker', 'postgres') eq '';
		}),
	'the warm-up sweep has settled everything and left');

sub settled
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT active_since IS NULL FROM idempotency.idempotency_keys "
		  . "WHERE scope = 'default' AND key = '$key'") eq 't';
}

sub claim_token
{
	my ($key) = @_;
	my ($outcome, $token) = split /\|/, $node->safe_psql('postgres', claim_sql($key, '1 hour'));
	is($outcome, 'claimed', "$key is claimed with a lease of an hour");
	return $token;
}

# --- complete ----------------------------------------------------------------
my $token = claim_token('completed-late');
$node->safe_psql('postgres',
	"SELECT idempotency.idem_complete('completed-late', $token, '{}'::jsonb)");
my $waited = poll_until(30, sub { settled('completed-late') });
ok(defined $waited, 'a completed key is settled without waiting for the row-change look');
diag(sprintf('completed key settled after %.1f s', $waited)) if defined $waited;

ok( poll_until(30, sub { backend_pid($node, 'idempotency worker', 'postgres') eq '' }),
	'that sweep has left');

# --- fail ----------------------------------------------------------------------
$token = claim_token('failed-late');
$node->safe_psql('postgres',
	"SELECT idempotency.idem_fail('failed-late', $token, 'boom', true, '1 hour'::interval)");
$waited = poll_until(30, sub { settled('failed-late') });
ok(defined $waited, 'a failed key is settled without waiting for the row-change look');

is($node->safe_psql('postgres', $unsettled), '0', 'no finished key is left in the live index');

done_testing();
