# An upgrade between PostgreSQL majors with pg_upgrade: a cluster of the
# older major holding keys in every state and outbox events in every state
# is upgraded to this major; afterwards the rows are the same, the sequences
# of fencing tokens and event ids go on, the claims and the relay's calls
# answer as before, and the background workers run and settle a lease that
# ran out while the cluster was down. The new cluster loads the library in
# pg_upgrade's binary-upgrade mode with its workers enabled.
#
# It needs the older major with the extension installed:
#   IDEM_UPGRADE_FROM=/usr/lib/postgresql/17   (its bin/ and lib/)
# `make test-matrix` runs it in a Debian root holding two majors.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/..";
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_install = $ENV{IDEM_UPGRADE_FROM};
plan skip_all => 'IDEM_UPGRADE_FROM names no older PostgreSQL installation'
  unless defined $old_install && -x "$old_install/bin/postgres";

my @conf = (
	"shared_preload_libraries = 'idempotency'",
	"idempotency.naptime = '200ms'",
	"idempotency.launcher_naptime = '1s'");

# Both clusters with data checksums: 18's initdb turns them on by default,
# and pg_upgrade needs the two to agree.
my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init(extra => ['--data-checksums']);
# The old cluster's workers are off, so that the lease below is still
# unsettled when the cluster stops; the new cluster's must settle it.
$old->append_conf('postgresql.conf',
	join("\n", @conf, "idempotency.worker_enabled = off") . "\n");
$old->start;
my $old_major = $old->pg_version->major;

$old->safe_psql('postgres', 'CREATE DATABASE app');
$old->safe_psql('app', 'CREATE EXTENSION idempotency');

# --- keys in every state --------------------------------------------------------
$old->safe_psql(
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
is( $old->safe_psql(
		'app', q{
SELECT string_agg(DISTINCT status::text, ',' ORDER BY status::text)
  FROM idempotency.idempotency_keys}),
	'COMPLETED,FAILED_FINAL,FAILED_RETRYABLE,PROCESSING,RECEIVED',
	"PostgreSQL $old_major: keys in every state");

# --- outbox events in every state -----------------------------------------------
# in flight (key c, leased for an hour), delivered, dead; then pending ones:
# one behind the in-flight event of its key, two free, one not yet due.
$old->safe_psql(
	'app', q{
SELECT idempotency.outbox_enqueue('orders', '{"e": "in-flight"}', key => 'c');
SELECT idempotency.outbox_enqueue('orders', '{"e": "delivered"}', key => 'd');
SELECT idempotency.outbox_enqueue('orders', '{"e": "dead"}', key => 'x');
});
my %claimed = map { my ($id, $e) = split /\|/; ($e => $id) } split /\n/,
  $old->safe_psql('app',
	q{SELECT id, payload->>'e' FROM idempotency.outbox_claim('relay-a', 3, '1 hour')});
is(scalar(keys %claimed), 3, 'three events claimed before the upgrade');
$old->safe_psql('app', "SELECT idempotency.outbox_ack(ARRAY[$claimed{delivered}]::int8[])");
$old->safe_psql('app',
	"SELECT idempotency.outbox_nack($claimed{dead}, 'rejected', retryable => false)");
$old->safe_psql(
	'app', q{
SELECT idempotency.outbox_enqueue('orders', '{"e": "behind-c"}', key => 'c');
SELECT idempotency.outbox_enqueue('orders', '{"e": "free-1"}', key => 'a');
SELECT idempotency.outbox_enqueue('orders', '{"e": "free-2"}');
SELECT idempotency.outbox_enqueue('orders', '{"e": "later"}',
    deliver_at => clock_timestamp() + interval '1 hour');
});
is( $old->safe_psql(
		'app', q{
SELECT string_agg(state::text || ':' || (payload->>'e'), ',' ORDER BY id)
  FROM idempotency.outbox}),
	'in_flight:in-flight,delivered:delivered,dead:dead,pending:behind-c,'
	  . 'pending:free-1,pending:free-2,pending:later',
	'outbox events in every state');

# Every row, as text; k-expiring is left out, the new workers settle it.
my $rows = q{
SELECT string_agg(k::text, E'\n' ORDER BY scope, key)
  FROM idempotency.idempotency_keys k WHERE key <> 'k-expiring'
UNION ALL
SELECT string_agg(o::text, E'\n' ORDER BY id) FROM idempotency.outbox o};
my $rows_before = $old->safe_psql('app', $rows);
my $max_token = $old->safe_psql('app', 'SELECT max(token) FROM idempotency.idempotency_keys');
my $max_id = $old->safe_psql('app', 'SELECT max(id) FROM idempotency.outbox');
my $version = $old->safe_psql('app',
	"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'");
$old->stop;

# --- pg_upgrade ------------------------------------------------------------------
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init(extra => ['--data-checksums']);
$new->append_conf('postgresql.conf', join("\n", @conf) . "\n");
my $new_major = $new->pg_version->major;
cmp_ok($new_major, '>', $old_major, "upgrading from $old_major to $new_major");

command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $old->config_data('--bindir'),
		'-B', $new->config_data('--bindir'),
		'-s', $new->host,
		'-p', $old->port, '-P', $new->port
	],
	"pg_upgrade from $old_major to $new_major");
$new->start;

is( $new->safe_psql('app',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	$version,
	'the extension is at the same version');
is($new->safe_psql('app', $rows), $rows_before, 'every key and event is unchanged');

# --- the workers run on the upgraded cluster ---------------------------------------
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
	'the worker settles the lease that ran out before the upgrade');

# --- keys and the outbox answer as before ------------------------------------------
is( $new->safe_psql('app',
		q{SELECT outcome, result FROM idempotency.idem_claim('k-completed', '{"n": 4}')}),
	'completed|{"charge": 981}',
	'a duplicate of a completed key gets the stored result');
my $token = $new->safe_psql('app',
	q{SELECT token FROM idempotency.idem_claim('k-received', '{"n": 1}') WHERE outcome = 'claimed'});
cmp_ok($token, '>', $max_token, 'fencing tokens go on from where they were');
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
is( $new->safe_psql('app', qq{SELECT idempotency.outbox_ack(ARRAY[$claimed{'in-flight'}]::int8[])}),
	'1', 'the relay that held an event before the upgrade acks it');
cmp_ok(
	$new->safe_psql('app', q{SELECT idempotency.outbox_enqueue('orders', '{"e": "new"}')}),
	'>', $max_id, 'event ids go on from where they were');

$new->stop;
done_testing();
