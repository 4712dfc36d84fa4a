# A logical backup keeps the dedup window: pg_dump writes the tombstones of
# the keys whose results have expired, and a late duplicate in the restored
# database still gets the tombstone's answer (completed or failed, result
# NULL, result_expired), another request under the key still a mismatch,
# and no key is created again.
#
# A database is filled with finished keys, some past their result's
# retention (the purge turns them into tombstones, one with a key beyond
# ASCII) and some kept whole, then dumped and restored two ways (pg_dump
# -Fc and pg_restore; pg_dump --data-only into a database with the
# extension) and once more into a LATIN1 database: a tombstone is found by
# a digest of the key's UTF-8 bytes, whatever the database's encoding. A
# LATIN1 database restored into a UTF-8 one keeps its fingerprints and step
# keys too.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The purge runs when this test calls it, not when a worker would.
my $node = idem_node('tombstone_restore', conf => ["idempotency.worker_enabled = off"]);
my $dir = PostgreSQL::Test::Utils::tempdir;

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql(
	'src', q{
CREATE EXTENSION idempotency;
-- 100 keys whose results expire at once, and 10 kept whole.
SELECT count(idempotency.idem_complete('gone-' || g, (idempotency.idem_claim('gone-' || g, jsonb_build_object('n', g))).token,
                                       jsonb_build_object('charge', g), retain => '0'))
  FROM generate_series(1, 100) g;
SELECT count(idempotency.idem_complete('kept-' || g, (idempotency.idem_claim('kept-' || g, jsonb_build_object('n', g))).token,
                                       jsonb_build_object('charge', g)))
  FROM generate_series(1, 10) g;
SELECT idempotency.idem_fail('refused', (idempotency.idem_claim('refused', '{"card": 4}')).token, 'card refused', false,
                             retain => '0');
SELECT idempotency.idem_complete('café', (idempotency.idem_claim('café', '{"cream": 1}', scope => 'déjà')).token,
                                 '{"ok": true}', scope => 'déjà', retain => '0');});
my $purged = $node->safe_psql('src',
	q{SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys'});
is($purged, 102, 'src: the purge turned the 102 expired keys into tombstones');

# What must come back: the tombstones and the keys, row for row. (This
# file's text is UTF-8: the statements that hold letters beyond ASCII say
# so, whatever the database's encoding.)
sub rows_of
{
	my ($db, $table) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) || ': ' || md5(string_agg(t::text, E'\\n' ORDER BY t::text)) FROM idempotency.$table t");
}
my $tombstones = rows_of('src', 'key_tombstones');
my $keys = rows_of('src', 'idempotency_keys');
like($tombstones, qr/^102: /, 'src: 102 tombstones');
like($keys, qr/^10: /, 'src: 10 keys kept whole');

my $pg_bin = sub { return [ $_[0], '-d', $node->connstr($_[1]), @_[ 2 .. $#_ ] ] };
command_ok($pg_bin->('pg_dump', 'src', '-Fc', '-f', "$dir/full.dump"), 'pg_dump -Fc');
command_ok($pg_bin->('pg_dump', 'src', '--data-only', '-f', "$dir/data.sql"), 'pg_dump --data-only');

$node->safe_psql('postgres', q{
CREATE DATABASE r_full;
CREATE DATABASE r_data;
CREATE DATABASE r_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;});
command_ok($pg_bin->('pg_restore', 'r_full', '--exit-on-error', "$dir/full.dump"),
	'full: pg_restore into a fresh database');
$node->safe_psql('r_data', 'CREATE EXTENSION idempotency');
command_ok($pg_bin->('psql', 'r_data', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', "$dir/data.sql"),
	'data: psql -f the data-only dump into a fresh database with the extension');
command_ok($pg_bin->('pg_restore', 'r_latin1', '--exit-on-error', "$dir/full.dump"),
	'latin1: pg_restore into a LATIN1 database');

for my $db (qw(r_full r_data r_latin1))
{
	is(rows_of($db, 'key_tombstones'), $tombstones, "$db: every tombstone is back");
	is(rows_of($db, 'idempotency_keys'), $keys, "$db: every key is back");

	is( $node->safe_psql(
			$db, q{
SELECT string_agg(concat_ws(' ', outcome, status, result, result_expired), E'\n' ORDER BY g)
  FROM generate_series(1, 100) g, idempotency.idem_claim('gone-' || g, jsonb_build_object('n', g))
 GROUP BY outcome, status, result, result_expired}),
		join("\n", ('completed COMPLETED t') x 100),
		"$db: a late duplicate of each of the 100 gets the tombstone's answer");
	is( $node->safe_psql(
			$db, q{SELECT concat_ws(' ', outcome, status, result_expired) FROM idempotency.idem_claim('gone-7', '{"n": 8}')}),
		'mismatch COMPLETED t', "$db: another request under a tombstoned key is a mismatch");
	is( $node->safe_psql(
			$db, q{SELECT concat_ws(' ', outcome, status, error, result_expired) FROM idempotency.idem_claim('refused', '{"card": 4}')}),
		'failed FAILED_FINAL t', "$db: a final failure answers failed from its tombstone");
	is( $node->safe_psql(
			$db, q{SET client_encoding = 'UTF8';
SELECT concat_ws(' ', outcome, status, result_expired) FROM idempotency.idem_claim('café', '{"cream": 1}', scope => 'déjà')}),
		'completed COMPLETED t', "$db: a key beyond ASCII is found by its digest");
	is( $node->safe_psql(
			$db, q{SELECT concat_ws(' ', outcome, result, result_expired) FROM idempotency.idem_claim('kept-3', '{"n": 3}')}),
		'completed {"charge": 3} f', "$db: a key kept whole replays its result");
	is( $node->safe_psql(
			$db, q{SELECT concat_ws(' ', status, result_expired) FROM idempotency.idem_get('gone-1')}),
		'COMPLETED t', "$db: idem_get answers from the tombstone");
	is(rows_of($db, 'idempotency_keys'), $keys, "$db: the duplicates created no key");
	is(rows_of($db, 'key_tombstones'), $tombstones, "$db: ... and changed no tombstone");

	# The restored tombstones are purged when they are due, and the key is
	# new again.
	is( $node->safe_psql(
			$db, q{
UPDATE idempotency.key_tombstones SET forget_at = now() - interval '1 second';
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_tombstones';}),
		102, "$db: the restored tombstones are purged when due");
	is($node->safe_psql($db, q{SELECT outcome FROM idempotency.idem_claim('gone-1', '{"n": 1}')}),
		'claimed', "$db: ... and the key may be used again");
}

# A SQL_ASCII database, in each edition: its text has no declared
# encoding, so the digest is taken over the bytes as they are. A key with a
# byte that is not valid UTF-8 is purged and answered as any other (a
# conversion to UTF-8 would refuse it: the purge would fail, and with it
# every purge of the database), and a key written in UTF-8 has the digest
# it has in a UTF-8 database.
my $utf8_digest = $node->safe_psql('postgres', q{SET client_encoding = 'UTF8';
SELECT encode(substr(sha256(convert_to('default', 'UTF8') || '\x00'::bytea || convert_to('café', 'UTF8')), 1, 16), 'hex')::uuid});
for my $edition (qw(idempotency idempotency_sql))
{
	my $db = "ascii_$edition";
	$node->safe_psql('postgres',
		"CREATE DATABASE $db ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql($db, "CREATE EXTENSION $edition");
	is( $node->safe_psql(
			$db, q{
SELECT count(idempotency.idem_complete(k, (idempotency.idem_claim(k, '{"n": 1}')).token, '{"ok": 1}', retain => '0'))
  FROM unnest(ARRAY[E'caf\xe9', 'plain', 'café']) k;
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys';}),
		"3\n3", "$db: the purge moves a key with a byte that is not UTF-8 with the others");
	is( $node->safe_psql(
			$db, q{
SELECT string_agg(concat_ws(' ', outcome, status, result_expired), ', ' ORDER BY k)
  FROM unnest(ARRAY[E'caf\xe9', 'plain', 'café']) k, idempotency.idem_claim(k, '{"n": 1}')}),
		join(', ', ('completed COMPLETED t') x 3), "$db: each answers from its tombstone");
	is( $node->safe_psql(
			$db, qq{SELECT count(*) FROM idempotency.key_tombstones WHERE key_digest = '$utf8_digest'}),
		1, "$db: a key written in UTF-8 has its UTF-8 digest");
	is($node->safe_psql($db, q{SELECT outcome FROM idempotency.idem_claim(E'new\xe9', '{"n": 1}')}),
		'claimed', "$db: a new key with a byte that is not UTF-8 is claimed");
}

# A LATIN1 database restored into a UTF-8 one, in each edition: request
# fingerprints (and the prefixes tombstones keep) and step keys are taken
# over UTF-8, so the retries of a request beyond ASCII still match after
# the move, and a step's key stays the same. A fingerprint stored in the
# database's encoding (before 0.7.0) still matches in that database.
for my $edition (qw(idempotency idempotency_sql))
{
	my ($latin1, $utf8) = ("latin1_$edition", "moved_$edition");
	$node->safe_psql('postgres',
		"CREATE DATABASE $latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql('postgres', "CREATE DATABASE $utf8");
	$node->safe_psql($latin1, "CREATE EXTENSION $edition");
	my $finished = $node->safe_psql(
		$latin1, q{SET client_encoding = 'UTF8';
SELECT count(idempotency.idem_complete(k, (idempotency.idem_claim(k, '{"name": "café"}')).token, '{"ok": 1}',
                                       retain => CASE WHEN k LIKE 'gone%' THEN interval '0' END))
  FROM unnest(ARRAY['live', 'gone', 'early', 'gone-early']) k;
-- The forms an earlier version stored: the text in LATIN1.
UPDATE idempotency.idempotency_keys
   SET fingerprint = sha256(convert_to('{"name": "café"}'::jsonb::text, 'LATIN1'))
 WHERE key IN ('early', 'gone-early');
SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys';});
	is($finished, "4\n2", "$latin1: four keys finished, two of them purged into tombstones");
	my $answers = q{SET client_encoding = 'UTF8';
SELECT string_agg(concat_ws(' ', k, outcome, result_expired), ', ' ORDER BY k)
  FROM unnest(ARRAY[%s]) k, idempotency.idem_claim(k, '%s')};
	is( $node->safe_psql($latin1, sprintf($answers, q{'live', 'gone', 'early', 'gone-early'}, '{"name": "café"}')),
		'early completed f, gone completed t, gone-early completed t, live completed f',
		"$latin1: each key's retry matches, in the fingerprint's form of now and of before");
	is( $node->safe_psql($latin1, sprintf($answers, q{'live', 'gone', 'early', 'gone-early'}, '{"name": "cafe"}')),
		'early mismatch f, gone mismatch t, gone-early mismatch t, live mismatch f',
		"$latin1: another request under each is a mismatch");
	my $step_key = q{SET client_encoding = 'UTF8';
SELECT idempotency.idem_step_key('café', 'charge', scope => 'déjà')};
	my $latin1_step_key = $node->safe_psql($latin1, $step_key);

	command_ok($pg_bin->('pg_dump', $latin1, '-Fc', '-f', "$dir/$latin1.dump"), "$latin1: pg_dump -Fc");
	command_ok($pg_bin->('pg_restore', $utf8, '--exit-on-error', "$dir/$latin1.dump"),
		"$utf8: pg_restore into a UTF-8 database");
	is( $node->safe_psql($utf8, sprintf($answers, q{'live', 'gone'}, '{"name": "café"}')),
		'gone completed t, live completed f', "$utf8: the retries beyond ASCII still match");
	is( $node->safe_psql($utf8, sprintf($answers, q{'live', 'gone'}, '{"name": "cafe"}')),
		'gone mismatch t, live mismatch f', "$utf8: another request is still a mismatch");
	is($node->safe_psql($utf8, $step_key), $latin1_step_key, "$utf8: a step's key is the one it had in LATIN1");
	like($latin1_step_key, qr/^charge-[0-9a-f]{32}$/, "$latin1: the step key is the step's name and 32 hex digits");
}

done_testing();
