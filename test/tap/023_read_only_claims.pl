# A duplicate can be answered where nothing can be written: on a hot standby
# and in a READ ONLY transaction on the primary, a claim (or register) of a
# key whose answer needs no change (completed, with its stored result; in
# progress; failed; retry later; a mismatching request) is answered from a
# read, and a call that would have to write (a new key, a retry that is due)
# raises 25006 with a hint, and writes nothing.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = idem_node('primary', allows_streaming => 1);
$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
SELECT idempotency.idem_complete('done', (idempotency.idem_claim('done', '{"n": 1}')).token, '{"ok": true}');
SELECT idempotency.idem_claim('busy', NULL, '1 hour');
SELECT idempotency.idem_fail('final', (idempotency.idem_claim('final')).token, 'fatal', false);
SELECT idempotency.idem_fail('later', (idempotency.idem_claim('later')).token, 'boom', true, '1 hour');
SELECT idempotency.idem_fail('due', (idempotency.idem_claim('due')).token, 'boom', true, '0');
SELECT idempotency.outbox_enqueue('ro', '{"n": 1}', 'k1');
SELECT idempotency.outbox_enqueue('ro', '{"n": 2}');
SELECT count(*) FROM idempotency.outbox_claim('primary-relay', 1, '1 hour', '{ro}');});
my $busy_token = $primary->safe_psql('postgres',
	q{SELECT token FROM idempotency.idempotency_keys WHERE key = 'busy'});
my $held_event = $primary->safe_psql('postgres',
	q{SELECT id FROM idempotency.outbox WHERE state = 'in_flight'});
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');

# Calls answered from a read, and what they answer.
my @answered = (
	[ q{idem_claim('done', '{"n": 1}')}, 'completed {"ok": true}', 'a claim of a completed key replays its result' ],
	[ q{idem_claim('done', '{"n": 2}')}, 'mismatch ', 'a claim with another request is a mismatch' ],
	[ q{idem_claim('busy')}, 'in_progress ', 'a claim of a key in progress answers in_progress' ],
	[ q{idem_claim('final')}, 'failed ', 'a claim of a FAILED_FINAL key answers failed' ],
	[ q{idem_claim('later')}, 'retry_later ', 'a claim of a retry not due yet answers retry_later' ],
	[ q{idem_register('done', '{"n": 1}')}, 'completed {"ok": true}', 'a register of a completed key answers completed' ],
);
# Calls that would have to write.
my @refused = (
	[ q{idem_claim('new-key')}, 'a claim of a new key' ],
	[ q{idem_claim('due')}, 'a claim of a retry that is due' ],
	[ q{idem_register('new-key')}, 'a register of a new key' ],
);

# The calls of a holder and of a relay, which always write: refused with
# 25006 as the statements they stand for are, before they change anything.
my @writers = (
	[ "SELECT idempotency.idem_complete('busy', $busy_token, '{}')", 'idem_complete' ],
	[ "SELECT idempotency.idem_heartbeat('busy', $busy_token)", 'idem_heartbeat' ],
	[ "SELECT idempotency.idem_fail('busy', $busy_token, 'x', true)", 'idem_fail' ],
	[ "SELECT idempotency.idem_release('busy', $busy_token)", 'idem_release' ],
	[ "SELECT count(*) FROM idempotency.outbox_claim('ro-relay', 10, '1 minute', '{ro}')", 'outbox_claim' ],
	[ "SELECT idempotency.outbox_ack(ARRAY[$held_event]::bigint[])", 'outbox_ack' ],
	[ "SELECT idempotency.outbox_enqueue('ro', '{}', 'k2')", 'outbox_enqueue with a key' ],
	[ "SELECT idempotency.outbox_enqueue('ro', '{}')", 'outbox_enqueue' ],
);

# Runs each call on NODE, with PREFIX (and SUFFIX) around it.
sub check_calls
{
	my ($node, $where, $prefix, $suffix) = @_;
	$suffix //= '';
	for my $call (@answered)
	{
		my ($sql, $expected, $what) = @$call;
		my ($rc, $out, $err) = $node->psql('postgres',
			"$prefix SELECT outcome || ' ' || coalesce(result::text, '') FROM idempotency.$sql; $suffix");
		is($out, $expected, "$where: $what") or diag($err);
	}
	for my $call (@refused)
	{
		my ($sql, $what) = @$call;
		my ($rc, $out, $err) = $node->psql('postgres',
			"\\set VERBOSITY verbose\n$prefix SELECT outcome FROM idempotency.$sql; $suffix");
		like($err, qr/ERROR:  25006: idempotency: idem_\w+ would change the key, which a read-only transaction cannot/,
			"$where: $what raises 25006");
		like($err, qr/HINT:  A duplicate of finished work is answered anywhere, also on a hot standby; a call that creates or claims a key needs a read-write transaction on the primary\./,
			"$where: ... with the hint");
	}
	for my $call (@writers)
	{
		my ($sql, $what) = @$call;
		my ($rc, $out, $err) = $node->psql('postgres',
			"\\set VERBOSITY verbose\n$prefix $sql; $suffix");
		like($err, qr/ERROR:  25006: cannot execute \S+( \S+)* (in a read-only transaction|during recovery)/,
			"$where: $what raises 25006") or diag("out: $out, err: $err");
	}
}

check_calls($standby, 'standby', '');
check_calls($primary, 'READ ONLY transaction', 'BEGIN READ ONLY;', 'COMMIT;');
check_calls($primary, 'default_transaction_read_only', 'SET default_transaction_read_only = on;');

# Nothing was written on the primary: the refused keys do not exist, the
# due retry is still FAILED_RETRYABLE, the key in progress keeps its token.
is( $primary->safe_psql(
		'postgres', q{
SELECT string_agg(key || ' ' || status || ' ' || attempts, ',' ORDER BY key) FROM idempotency.idempotency_keys}),
	'busy PROCESSING 1,done COMPLETED 1,due FAILED_RETRYABLE 1,final FAILED_FINAL 1,later FAILED_RETRYABLE 1',
	'the read-only calls changed nothing');
is( $primary->safe_psql(
		'postgres', q{
SELECT string_agg(coalesce(key, '-') || ' ' || state || ' ' || attempts || ' ' || coalesce(relay, '-'), ',' ORDER BY id)
  FROM idempotency.outbox}),
	'k1 in_flight 1 primary-relay,- pending 0 -',
	'the read-only calls changed no event');
is( $primary->safe_psql('postgres',
		qq{SELECT lease_until > now() + interval '50 minutes' FROM idempotency.idempotency_keys WHERE key = 'busy'}),
	't', 'the refused heartbeat left the lease as it was');
# And the same calls in a read-write transaction do write.
like($primary->safe_psql('postgres', claim_sql('new-key', '1 minute')),
	qr/^claimed\|\d+$/, 'read-write on the primary: a claim of a new key is claimed');
like($primary->safe_psql('postgres', claim_sql('due', '1 minute')),
	qr/^claimed\|\d+$/, 'read-write on the primary: the due retry is claimed');

$standby->stop;
$primary->stop;
done_testing();
