# The data of a move between PostgreSQL majors, shared by the pg_upgrade
# and the dump and restore tests: keys in every state and outbox events in
# every state in database app of the old cluster, and the checks that the
# new cluster holds the same rows, goes on with the same sequences, and that
# its workers and the extension's calls answer as before.
package MajorUpgrade;

use strict;
use warnings;

use Exporter 'import';
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(old_install idem_conf populate check_moved);

# The older installation (its bin/ and lib/) from IDEM_UPGRADE_FROM, or a
# skip of the whole file.
sub old_install
{
	my $dir = $ENV{IDEM_UPGRADE_FROM};
	plan skip_all => 'IDEM_UPGRADE_FROM names no older PostgreSQL installation'
	  unless defined $dir && -x "$dir/bin/postgres";
	return $dir;
}

# postgresql.conf lines of both clusters: the library preloaded, short naps.
sub idem_conf
{
	return join("\n",
		"shared_preload_libraries = 'idempotency'",
		"idempotency.naptime = '200ms'",
		"idempotency.launcher_naptime = '1s'", @_)
	  . "\n";
}

# Every row, as text; k-expiring is left out, the new workers settle it.
our $rows = q{
SELECT string_agg(k::text, E'\n' ORDER BY scope, key)
  FROM idempotency.idempotency_keys k WHERE key <> 'k-expiring'
UNION ALL
SELECT string_agg(o::text, E'\n' ORDER BY id) FROM idempotency.outbox o};

# populate(NODE): fills database app; returns what check_moved compares.
# k-expiring's lease ends a second later: run the old cluster with
# worker_enabled = off so that the new cluster's workers must settle it.
sub populate
{
	my ($node) = @_;
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION idempotency');

	# --- keys in every state --------------------------------------------------------
	$node->safe_psql(
		'app', q{
	SELECT idempotency.idem_register('k-received', '{"n": 1}');
	SELECT idempotency.idem_claim('k-processing', '{"n": 2}', lease => '1 hour');
	SELECT idempotency.idem_claim('k-expiring', '{"n": 3}', lease => '1 second');
	SELECT idempotency.idem_claim('k-completed', '{"n": 4}');
	SELECT idempotency.idem_complete('k-completed',
	    (idempotency.idem_get('k-completed')).token, '{"charge": 981}');
	SELECT idempotency.idem_claim('k-retryable', '{"n": 5}');
	SELECT idempotency.idem_fail('k-retryable',
	    (idempotency.idem_get('k-retryable')).token, 'busy', retry_in => '1 hour');
	SELECT idempotency.idem_claim('k-final', '{"n": 6}');
	SELECT idempotency.idem_fail('k-final',
	    (idempotency.idem_get('k-final')).token, 'refused', retryable => false);
	});
	is( $node->safe_psql(
			'app', q{
	SELECT string_agg(DISTINCT status::text, ',' ORDER BY status::text)
	  FROM idempotency.idempotency_keys}),
		'COMPLETED,FAILED_FINAL,FAILED_RETRYABLE,PROCESSING,RECEIVED',
		'keys in every state');

	# --- outbox events in every state -----------------------------------------------
	# in flight (key c, leased for an hour), delivered, dead; then pending ones:
	# one behind the in-flight event of its key, two free, one not yet due.
	$node->safe_psql(
		'app', q{
	SELECT idempotency.outbox_enqueue('orders', '{"e": "in-flight"}', key => 'c');
	SELECT idempotency.outbox_enqueue('orders', '{"e": "delivered"}', key => 'd');
	SELECT idempotency.outbox_enqueue('orders', '{"e": "dead"}', key => 'x');
	});
	my %claimed = map { my ($id, $e) = split /\|/; ($e => $id) } split /\n/,
	  $node->safe_psql('app',
		q{SELECT id, payload->>'e' FROM idempotency.outbox_claim('relay-a', 3, '1 hour')});
	is(scalar(keys %claimed), 3, 'three events claimed');
	$node->safe_psql('app', "SELECT idempotency.outbox_ack(ARRAY[$claimed{delivered}]::int8[])");
	$node->safe_psql('app',
		"SELECT idempotency.outbox_nack($claimed{dead}, 'rejected', retryable => false)");
	$node->safe_psql(
		'app', q{
	SELECT idempotency.outbox_enqueue('orders', '{"e": "behind-c"}', key => 'c');
	SELECT idempotency.outbox_enqueue('orders', '{"e": "free-1"}', key => 'a');
	SELECT idempotency.outbox_enqueue('orders', '{"e": "free-2"}');
	SELECT idempotency.outbox_enqueue('orders', '{"e": "later"}',
	    deliver_at => clock_timestamp() + interval '1 hour');
	});
	is( $node->safe_psql(
			'app', q{
	SELECT string_agg(state::text || ':' || (payload->>'e'), ',' ORDER BY id)
	  FROM idempotency.outbox}),
		'in_flight:in-flight,delivered:delivered,dead:dead,pending:behind-c,'
		  . 'pending:free-1,pending:free-2,pending:later',
		'outbox events in every state');

	my %before;
	$before{rows} = $node->safe_psql('app', $rows);
	$before{max_token} = $node->safe_psql('app', 'SELECT max(token) FROM idempotency.idempotency_keys');
	$before{max_id} = $node->safe_psql('app', 'SELECT max(id) FROM idempotency.outbox');
	$before{version} = $node->safe_psql('app',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'");
	$before{in_flight} = $claimed{'in-flight'};
	return \%before;
}

# check_moved(NEW, BEFORE, HOW): NEW, started, holds app as populate left it.
sub check_moved
{
	my ($new, $before, $how) = @_;
	is( $new->safe_psql('app',
			"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
		$before->{version},
		'the extension is at the same version');
	is($new->safe_psql('app', $rows), $before->{rows}, "every key and event is unchanged ($how)");

	# --- the workers run on the new cluster ---------------------------------------
	isnt(wait_for_backend($new, 'idempotency launcher', undef, 20), '', 'the launcher runs');
	isnt(wait_for_backend($new, 'idempotency worker', 'app', 20), '', 'the worker of app runs');
	ok( poll_until(
			30,
			sub {
				my $row = key_row($new, 'app', 'k-expiring');
				return $row && $row->{status} eq 'FAILED_RETRYABLE'
				  && $row->{last_error} eq 'lease expired';
			},
			100),
		'the worker settles the lease that ran out before the move');

	# --- keys and the outbox answer as before ------------------------------------------
	is( $new->safe_psql('app',
			q{SELECT outcome, result FROM idempotency.idem_claim('k-completed', '{"n": 4}')}),
		'completed|{"charge": 981}',
		'a duplicate of a completed key gets the stored result');
	my $token = $new->safe_psql('app',
		q{SELECT token FROM idempotency.idem_claim('k-received', '{"n": 1}') WHERE outcome = 'claimed'});
	cmp_ok($token, '>', $before->{max_token}, 'fencing tokens go on from where they were');
	is( $new->safe_psql('app',
			q{SELECT outcome FROM idempotency.idem_claim('k-processing', '{"n": 2}')}),
		'in_progress',
		'a key under a lease stays held');

	is( $new->safe_psql(
			'app', q{
	SELECT string_agg(payload->>'e', ',' ORDER BY id)
	  FROM idempotency.outbox_claim('relay-b', 10, '1 minute')}),
		'free-1,free-2',
		'a relay gets the due events in order, none behind an event in flight');
	is( $new->safe_psql('app', qq{SELECT idempotency.outbox_ack(ARRAY[$before->{in_flight}]::int8[])}),
		'1', 'the relay that held an event before the move acks it');
	# psql, not safe_psql: an id handed out again fails on the primary key.
	my (undef, $id) =
	  $new->psql('app', q{SELECT idempotency.outbox_enqueue('orders', '{"e": "new"}')});
	cmp_ok($id || 0, '>', $before->{max_id}, 'event ids go on from where they were');
	return;
}

1;
