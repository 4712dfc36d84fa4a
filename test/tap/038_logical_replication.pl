# A database that receives the extension's tables by logical replication,
# as the new side of an upgrade or a move by logical replication does
# (docs/upgrades.md), is left to its publisher's workers until the
# subscription is dropped.
#
# Green subscribes to every table of blue. While the subscription stands,
# green's workers expire no lease and purge nothing there (a purge of their
# own would insert the tombstone that blue's purge sends next, and the
# subscription would stop on a duplicate key), say so once, and the views
# count from the tables; idem_maintenance() refuses. The subscription is
# held back while blue's workers expire a lease and purge finished keys,
# and green's workers start again and again meanwhile; once it resumes,
# blue's changes apply without an error. Then the switchover the docs
# describe: the sequences copied, the subscription dropped. Green's workers
# resume and say so, its counts are recounted, and its keys, tokens and
# event ids continue blue's.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $blue = idem_node('blue', conf => ['wal_level = logical', 'max_wal_senders = 10', 'max_replication_slots = 10']);
my $green = idem_node('green', conf => ['log_min_messages = debug1']);
for my $node ($blue, $green)
{
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION idempotency');
}
my $oid = $green->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = 'app'");
my $keys = 40;

# What blue holds before green subscribes: a key that stays (its result is
# replayed after the switchover), events queued, a relay's grant (its role
# exists on both sides, as pg_dumpall --globals-only makes it).
$_->safe_psql('postgres', 'CREATE ROLE orders_relay LOGIN') for ($blue, $green);
$blue->safe_psql(
	'app', q{
SELECT idempotency.grant_relay('orders_relay', ARRAY['orders']);
SELECT idempotency.idem_complete('kept', (idempotency.idem_claim('kept', '{"order": 1}')).token,
                                 '{"charge": "ch-1"}');
SELECT idempotency.outbox_enqueue('orders', jsonb_build_object('order', i)) FROM generate_series(1, 5) i;
CREATE PUBLICATION everything FOR ALL TABLES;
});

# The docs' steps on the new side: the rights table that CREATE EXTENSION
# filled is emptied, as the subscription copies blue's.
my $offset = -s $green->logfile;
my $blue_conn = $blue->connstr() . ' dbname=app';
$green->safe_psql('app', 'TRUNCATE idempotency.role_kind_rights');
$green->safe_psql('app', "CREATE SUBSCRIPTION green CONNECTION '$blue_conn' PUBLICATION everything");
ok( $green->poll_query_until(
		'app', "SELECT count(*) > 0 AND bool_and(srsubstate = 'r') FROM pg_subscription_rel"),
	'every table of the subscription is copied and ready');

is($green->safe_psql('app', q{SELECT role::text || ' ' || array_to_string(topics, ',') FROM idempotency.relay_grants}),
	'orders_relay orders', "blue's relay grant is on green");

sub log_since { return slurp_file($green->logfile, $offset); }
sub count_of { my ($re) = @_; my $n = () = log_since() =~ /$re/g; return $n; }
sub starts { return count_of(qr/idempotency launcher: worker for database $oid: /); }
my $fence_line =
  qr/idempotency worker: database "app" receives the extension's tables from subscription "green"/;
ok(poll_until(60, sub { count_of($fence_line) > 0 }), "green's worker says the database is behind the subscription");

# Work on blue whose end falls while green is held back: a lease that ends,
# and finished keys whose results pass their retention into tombstones.
# Both end 15 s from now, long after green has them.
like($blue->safe_psql('app', claim_sql('held', '15 seconds')), qr/^claimed\|/, 'a key claimed on blue with a 15 s lease');
$blue->safe_psql(
	'app', qq{
SELECT count((idempotency.idem_complete('done-' || i, (idempotency.idem_claim('done-' || i, '{}')).token,
                                        '{"ok": true}', retain => '15 seconds', retain_key => '1 hour')).outcome)
  FROM generate_series(1, $keys) i});
ok( $green->poll_query_until(
		'app', "SELECT count(*) = $keys FROM idempotency.idempotency_keys WHERE key LIKE 'done-%'"),
	'green received the finished keys');
is( $green->safe_psql(
		'app', "SELECT completed || ' ' || counted_by FROM idempotency.idem_stats WHERE scope = 'default'"),
	($keys + 1) . ' scan',
	"green's view counts the subscription's rows from the table");
$green->safe_psql('app', 'ALTER SUBSCRIPTION green DISABLE');
is( $green->safe_psql(
		'app', q{
SELECT lease_until > now() FROM idempotency.idempotency_keys WHERE key = 'held' AND status = 'PROCESSING'}),
	't', 'green is held back before the lease ends');

ok( $blue->poll_query_until(
		'app', qq{
SELECT (SELECT count(*) FROM idempotency.key_tombstones) = $keys
   AND (SELECT status FROM idempotency.idempotency_keys WHERE key = 'held') = 'FAILED_RETRYABLE'}),
	"blue's workers purged the finished keys into tombstones and expired the lease");
# Green's clock has passed the same ends: five more of its workers start
# while the subscription is held back.
my $starts_then = starts();
ok(poll_until(90, sub { starts() >= $starts_then + 5 }), 'five more workers start on green meanwhile');
is( $green->safe_psql(
		'app', q{
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'done-%') || ' '
    || (SELECT count(*) FROM idempotency.key_tombstones) || ' '
    || (SELECT status FROM idempotency.idempotency_keys WHERE key = 'held')}),
	"$keys 0 PROCESSING",
	"green's workers purged nothing and expired no lease");
is(count_of($fence_line), 1, 'the subscription is said once');
my ($rc, $out, $err) = $green->psql('app', 'SELECT * FROM idempotency.idem_maintenance()');
like($err, qr/idem_maintenance\(\): the extension's tables in this database are written by subscription "green"/,
	'idem_maintenance() refuses on green');

$green->safe_psql('app', 'ALTER SUBSCRIPTION green ENABLE');
ok( $green->poll_query_until(
		'app', q{
SELECT (SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'done-%') = 0
   AND (SELECT count(*) FROM idempotency.key_tombstones) = } . $keys . q{
   AND (SELECT status FROM idempotency.idempotency_keys WHERE key = 'held') = 'FAILED_RETRYABLE'}),
	"blue's purge and expiry apply on green");
is($green->safe_psql('app', "SELECT apply_error_count + sync_error_count FROM pg_stat_subscription_stats"),
	'0', 'the subscription met no error');
is(count_of(qr/ERROR:  duplicate key value/), 0, 'no duplicate key in green\'s log');

# --- the switchover ------------------------------------------------------------
# Writes stop on blue; the sequences are copied (logical replication does
# not carry them); the subscription is dropped.
my $blue_tokens = $blue->safe_psql('app', 'SELECT max(token) FROM idempotency.idempotency_keys');
my $blue_ids = $blue->safe_psql('app', 'SELECT max(id) FROM idempotency.outbox');
my $setvals = $blue->safe_psql(
	'app', q{
SELECT format('SELECT pg_catalog.setval(%L, %s);', schemaname || '.' || sequencename, last_value)
  FROM pg_catalog.pg_sequences WHERE schemaname = 'idempotency' AND last_value IS NOT NULL});
$green->safe_psql('app', $setvals);
$green->safe_psql('app', 'DROP SUBSCRIPTION green');

ok( poll_until(
		60, sub { count_of(qr/idempotency worker: database "app" no longer receives the extension's tables/) == 1 }),
	"green's worker says the subscription is gone");
# The worker's recount, or a read's, whichever comes first.
ok( $green->poll_query_until(
		'app', "SELECT counted_by = 'commits' FROM idempotency.outbox_lag WHERE topic = 'orders'"),
	"green's counts are recounted and kept again");
is($green->safe_psql('app', "SELECT pending FROM idempotency.outbox_lag WHERE topic = 'orders'"),
	'5', 'the queued events are counted');
like(
	$green->safe_psql(
		'app', q{SELECT outcome || ' ' || result::text FROM idempotency.idem_claim('kept', '{"order": 1}')}),
	qr/^completed \{"charge": "ch-1"\}$/,
	"a duplicate of blue's key replays its result on green");
is( $green->safe_psql('app', q{SELECT outcome FROM idempotency.idem_claim('done-1', '{}')}),
	'completed', "a duplicate of a key blue purged is answered from its tombstone on green");
my ($outcome, $token) = split /\|/, $green->safe_psql('app', claim_sql('on-green', '1 second'));
is($outcome, 'claimed', 'a new key is claimed on green');
cmp_ok($token, '>', $blue_tokens, "its token continues above blue's");
cmp_ok($green->safe_psql('app', q{SELECT idempotency.outbox_enqueue('orders', '{"order": 6}')}),
	'>', $blue_ids, "a new event's id continues above blue's");
ok(poll_until(60, sub { key_row($green, 'app', 'on-green')->{status} eq 'FAILED_RETRYABLE' }),
	"green's workers expire a lease again");

# --- the SQL edition -------------------------------------------------------------
# Its idem_maintenance() (the workers' sweeps, run by pg_cron or by hand)
# refuses the same way while a subscription writes its tables.
for my $node ($blue, $green)
{
	$node->safe_psql('postgres', 'CREATE DATABASE sqlapp');
	$node->safe_psql('sqlapp', 'CREATE EXTENSION idempotency_sql');
}
$blue->safe_psql('sqlapp', 'CREATE PUBLICATION everything FOR ALL TABLES');
$green->safe_psql('sqlapp', 'TRUNCATE idempotency.role_kind_rights');
$green->safe_psql('sqlapp',
	"CREATE SUBSCRIPTION green_sql CONNECTION '" . $blue->connstr() . " dbname=sqlapp' PUBLICATION everything");
ok( $green->poll_query_until(
		'sqlapp', "SELECT count(*) > 0 AND bool_and(srsubstate = 'r') FROM pg_subscription_rel"),
	"the SQL edition's tables are copied and ready");
($rc, $out, $err) = $green->psql('sqlapp', 'SELECT * FROM idempotency.idem_maintenance()');
like($err, qr/idem_maintenance\(\): the extension's tables in this database are written by subscription "green_sql"/,
	"the SQL edition's idem_maintenance() refuses on green");
$green->safe_psql('sqlapp', 'DROP SUBSCRIPTION green_sql');
is( $green->safe_psql('sqlapp', "SELECT count(*) FROM idempotency.idem_maintenance() WHERE task = 'expire_leases'"),
	'1', 'and runs once the subscription is dropped');

$green->stop;
$blue->stop;
done_testing();
