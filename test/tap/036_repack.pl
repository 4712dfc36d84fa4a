# pg_repack, a DBA's routine cure for a bloated queue table, run on every
# table of the extension while applications claim, complete and enqueue
# through the functions' direct table access and a consumer drains the
# outbox. pg_repack copies a table, logs the changes made meanwhile with a
# row trigger, replays them and swaps the copy in: a write that skipped the
# trigger, or a backend or worker that kept reading the old files, would
# lose work or answer from a table that is gone.
#
# The traffic, from pgbench, each transaction recording what it committed:
#   one       claim, complete and enqueue in one transaction
#   two       claim, then complete in a transaction of its own
#   consume   outbox_claim and outbox_ack of a backlog
#
# Each of the three busy tables (keys, tombstones, outbox) is repacked by
# itself while a transaction older than the repack stays open, so that
# pg_repack cannot swap after its copy and the traffic's writes meanwhile
# reach the new table only through its trigger's log; the purge moves the
# second kind's keys to tombstones meanwhile. After the swaps, with the
# traffic still running: every recorded key answers completed (the first
# kind with its result and one event), every acked event is delivered and
# none was handed out twice; a duplicate's claim replays the result, a key
# left only as a tombstone answers from it, and the background worker still
# expires a lease.
#
# pg_repack must be installed for the PostgreSQL under test (Debian's
# postgresql-15-repack, which `make test` installs). Where it is not, the
# test skips and says why, unless IDEM_REQUIRE_THIRD_PARTY is set (test/run.sh
# sets it where `make test` installs the package): then it fails.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

needs_extension('pg_repack', 'postgresql-15-repack');

my $node = idem_node('repack');
my $dir = PostgreSQL::Test::Utils::tempdir();
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE EXTENSION pg_repack;
SET idempotency.outbox_notify = off;
-- Something to repack: 40,000 finished keys, half of them deleted, and a
-- backlog of 20,000 events over 50 keys.
SELECT count(idempotency.idem_complete('old-' || g, (idempotency.idem_claim('old-' || g)).token, '{"v": 1}'))
  FROM generate_series(1, 40000) g;
DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'old-%' AND substr(key, 5)::int % 2 = 0;
SELECT count(idempotency.outbox_enqueue('backlog', '{}', 'k' || g % 50)) FROM generate_series(1, 20000) g;
-- Keys whose result was kept for no time: the purge leaves their tombstones.
SELECT count(idempotency.idem_complete('gone-' || g, (idempotency.idem_claim('gone-' || g)).token, '{"v": 2}',
                                       retain => '0', retain_key => '1 day'))
  FROM generate_series(1, 100) g;

CREATE TABLE done_one (k text PRIMARY KEY);
CREATE TABLE done_two (k text PRIMARY KEY);
CREATE TABLE acked (id bigint PRIMARY KEY);
CREATE FUNCTION one(k text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE o record;
BEGIN
  SELECT * INTO o FROM idempotency.idem_claim(k, scope => 'one');
  PERFORM idempotency.idem_complete(k, o.token, jsonb_build_object('k', k), scope => 'one');
  PERFORM idempotency.outbox_enqueue('one', jsonb_build_object('k', k), k);
  INSERT INTO done_one VALUES (k);
END $$;
CREATE FUNCTION two_complete(k text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.idem_complete(k, (SELECT token FROM idempotency.idempotency_keys
                                         WHERE scope = 'two' AND key = k), '{"ok": 2}', scope => 'two',
                                retain => '0', retain_key => '1 day');
  INSERT INTO done_two VALUES (k);
END $$;
CREATE FUNCTION consume() RETURNS void LANGUAGE plpgsql AS $$
DECLARE ids bigint[];
BEGIN
  ids := ARRAY(SELECT id FROM idempotency.outbox_claim('consumer', 5, topics => ARRAY['backlog']));
  PERFORM idempotency.outbox_ack(ids);
  INSERT INTO acked SELECT unnest(ids);
END $$;
});
ok( poll_until(60, sub {
		$node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.key_tombstones') == 100 }),
	'the purge left the tombstones of the keys kept for no time');

my %scripts = (
	'one.sql' => "\\set n random(1, 1000000000000000)\nSELECT one('one-' || :client_id || '-' || :n);\n",
	'two.sql' => "\\set n random(1, 1000000000000000)\n"
	  . "SELECT (idempotency.idem_claim('two-' || :client_id || '-' || :n, scope => 'two')).outcome;\n"
	  . "SELECT two_complete('two-' || :client_id || '-' || :n);\n",
	'consume.sql' => "SELECT consume();\n");
while (my ($name, $text) = each %scripts)
{
	open(my $fh, '>', "$dir/$name") or die "$name: $!";
	print $fh $text;
	close $fh;
}
my @connect = ('-h', $node->host, '-p', $node->port);
my $traffic = IPC::Run::start(
	[ 'pgbench', @connect, '-n', '-c', '6', '-R', '300', '-T', '600',
	  (map { ('-f', "$dir/$_") } qw(one.sql two.sql consume.sql)), 'postgres' ],
	'>', "$dir/pgbench.out", '2>&1');

sub done { return $node->safe_psql('postgres', 'SELECT (SELECT count(*) FROM done_one) + (SELECT count(*) FROM done_two)'); }
ok(poll_until(60, sub { done() >= 300 }), 'the traffic runs before the repack');

# Each table repacked by itself while a transaction that began before it
# stays open: pg_repack copies the table, then replays what its trigger
# logged meanwhile, and swaps only once that transaction has ended. The
# traffic commits while pg_repack replays, so those writes reach the new
# table only through the trigger's log. (The traffic is held to 300
# transactions a second, which the replay outpaces even on a busy machine:
# a table written faster than pg_repack replays is never swapped.)
sub replaying
{
	return $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT repack.repack_apply(%'}) > 0;
}
sub repack_with_traffic
{
	my ($table) = @_;
	my $old = $node->background_psql('postgres');
	$old->query_safe('BEGIN; SELECT pg_current_xact_id()');
	my $log = "$dir/repack_$table.log";
	my $repack = IPC::Run::start([ 'pg_repack', @connect, '-d', 'postgres', '-t', "idempotency.$table" ],
		'>', $log, '2>&1');
	# Replaying: seen running, or pg_repack's notice that it waits for the
	# open transaction, which it prints between replays once the copy is
	# done (the activity view shows a replay only while one runs, and a
	# replay of an empty log is short).
	ok(poll_until(120, sub { replaying() || slurp_file($log) =~ /Waiting for \d+ transactions? to finish/ }),
		"pg_repack copied $table and replays its log")
	  or diag(slurp_file($log));
	my $before = done();
	ok(poll_until(60, sub { done() >= $before + 200 }),
		"the traffic commits while pg_repack replays the changes to $table");
	$old->query_safe('COMMIT');
	$old->quit;
	ok($repack->finish, "pg_repack of $table exits 0") or diag(slurp_file($log));
}
repack_with_traffic($_) for qw(idempotency_keys key_tombstones outbox);

# The traffic goes on over the swapped tables.
my $after = done();
ok(poll_until(60, sub { done() >= $after + 300 }), 'the traffic goes on after the swap');
# TERM, not INT: a run started in the background by a shell without job
# control ignores SIGINT, and pgbench would run out its 600 s.
$traffic->signal('TERM');
$traffic->finish;

is( $node->safe_psql('postgres', q{
	SELECT count(*) FROM done_one d
	  LEFT JOIN idempotency.idempotency_keys k
	    ON k.scope = 'one' AND k.key = d.k AND k.status = 'COMPLETED' AND k.result = jsonb_build_object('k', d.k)
	  LEFT JOIN (SELECT key, count(*) AS n FROM idempotency.outbox WHERE topic = 'one' GROUP BY key) o
	    ON o.key = d.k
	 WHERE k.key IS NULL OR o.n IS DISTINCT FROM 1}),
	'0', 'every key claimed, completed and enqueued in one transaction is there, once, with its result and event');
is( $node->safe_psql('postgres', q{
	SELECT count(*) FROM done_two d
	 WHERE (idempotency.idem_claim(d.k, scope => 'two')).outcome <> 'completed'}),
	'0', 'every key completed after its own claim (its result kept for no time) answers completed, from its row or its tombstone');
cmp_ok($node->safe_psql('postgres', q{
	SELECT count(*) FROM done_two d
	  JOIN idempotency.key_tombstones t
	    ON t.key_digest = encode(substr(sha256(convert_to('two', 'UTF8') || '\x00'::bytea
	                                           || convert_to(d.k, 'UTF8')), 1, 16), 'hex')::uuid}),
	'>', 0, 'the purge moved some of them to tombstones meanwhile');
is( $node->safe_psql('postgres', q{
	SELECT count(*) FROM acked a
	 WHERE NOT EXISTS (SELECT 1 FROM idempotency.outbox o WHERE o.id = a.id AND o.state = 'delivered')}),
	'0', 'every acked event is delivered');
is( $node->safe_psql('postgres', q{
	SELECT count(*) = count(DISTINCT id) FROM acked}),
	't', 'no event was handed out twice');
is( $node->safe_psql('postgres', q{
	SELECT sum(pending + in_flight) FROM idempotency.outbox_lag WHERE topic = 'one'}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM done_one'),
	'the outbox counts every event enqueued');

my $one = $node->safe_psql('postgres', 'SELECT k FROM done_one ORDER BY k LIMIT 1');
is( $node->safe_psql('postgres',
		"SELECT outcome || ' ' || (result = jsonb_build_object('k', '$one'))::text FROM idempotency.idem_claim('$one', scope => 'one')"),
	'completed true', 'a duplicate after the repack replays the stored result');
is( $node->safe_psql('postgres',
		"SELECT outcome || ' ' || result_expired::text FROM idempotency.idem_claim('gone-7')"),
	'completed true', 'a key left only as a tombstone answers from it after the repack');
$node->safe_psql('postgres', "SELECT idempotency.idem_claim('leased', lease => '1 second')");
ok( poll_until(60, sub {
		$node->safe_psql('postgres', "SELECT status FROM idempotency.idempotency_keys WHERE key = 'leased'")
		  eq 'FAILED_RETRYABLE' }),
	'the background worker expires a lease in the repacked table');

done_testing();
