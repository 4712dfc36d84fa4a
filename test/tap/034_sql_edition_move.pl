# The move from the SQL edition to the C++ extension
# (src/sql_edition/move_to_cpp.sql, docs/managed-postgres.md) keeps every
# key, tombstone, event, inbox row, lock, token and right, and the work goes
# on afterwards as if nothing had moved.
#
# Database `app` has the SQL edition installed by its plain script, as a
# role without superuser that owns the schema, and data in every state:
# keys RECEIVED, PROCESSING (with a step), COMPLETED, FAILED_RETRYABLE (with
# a step), FAILED_FINAL, expired under their holder, and a tombstone; an
# inbox row; a lock; outbox events delivered, dead, in flight and pending
# (two of one key); roles of each kind. After the move: the same rows, the
# holders' tokens still fence (the live holder completes, a stale token is
# refused), a takeover gets a new token above every old one and the steps,
# the tombstone answers, the lock and the inbox hold, the relay acks its
# in-flight event and drains the rest in key order, new event ids follow
# the old ones, and each role has its rights. Database `app2` has the
# edition as an extension (CREATE EXTENSION idempotency_sql) and moves too;
# a view of the user's over the edition's table stops the move, which
# changes nothing.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = $ENV{TESTDIR} // "$FindBin::RealBin/../..";
my $node = idem_node('sql_edition_move', conf => ["idempotency.worker_enabled = off"]);
my $dir = PostgreSQL::Test::Utils::tempdir;

open(my $control, '<', "$root/idempotency.control") or die "idempotency.control: $!";
my ($version) = map { /^default_version = '(.*)'/ ? $1 : () } <$control>;
close($control);
system('bash', "$root/src/sql_edition/build.sh", $version, $dir) == 0
  or BAIL_OUT('the SQL edition does not build');
my $move = "$root/src/sql_edition/move_to_cpp.sql";

sub as
{
	my ($role, $db, $sql) = @_;
	return $node->safe_psql($db, $sql, extra_params => [ '-U', $role ]);
}

# ---------------------------------------------------------------- the SQL edition, plain install

$node->safe_psql('postgres', q{
CREATE DATABASE app;
CREATE ROLE idem_owner LOGIN;
CREATE ROLE app LOGIN;
CREATE ROLE relay LOGIN;
CREATE ROLE monitoring LOGIN;
CREATE ROLE admin LOGIN;});
$node->safe_psql('app', 'CREATE SCHEMA idempotency AUTHORIZATION idem_owner');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-U', 'idem_owner',
		'-f', "$dir/idempotency-sql--$version.sql" ],
	'the plain script installs as a role without superuser');
as('idem_owner', 'app', q{
SELECT idempotency.grant_application('app');
SELECT idempotency.grant_relay('relay', topics => '{orders}');
SELECT idempotency.grant_monitoring('monitoring');
SELECT idempotency.grant_admin('admin');});

# Keys in every state, their tokens kept in a table of the test's.
$node->safe_psql('app',
	'CREATE TABLE tokens (label text PRIMARY KEY, token bigint); GRANT ALL ON tokens TO app, relay');
as('app', 'app', q{
SELECT outcome FROM idempotency.idem_register('k-received', '{"n": 1}');
INSERT INTO tokens SELECT 'processing', token FROM idempotency.idem_claim('k-processing', '{"n": 2}', lease => '1 hour');
SELECT idempotency.idem_step('k-processing', (SELECT token FROM tokens WHERE label = 'processing'), 'reserve', '{"r": 1}');
INSERT INTO tokens SELECT 'completed', token FROM idempotency.idem_claim('k-completed', '{"n": 3}');
SELECT outcome FROM idempotency.idem_complete('k-completed', (SELECT token FROM tokens WHERE label = 'completed'), '{"charge": 3}');
INSERT INTO tokens SELECT 'retry', token FROM idempotency.idem_claim('k-retry', '{"n": 4}');
SELECT idempotency.idem_step('k-retry', (SELECT token FROM tokens WHERE label = 'retry'), 'charge', '"ch_4"');
SELECT idempotency.idem_fail('k-retry', (SELECT token FROM tokens WHERE label = 'retry'), 'timeout', retry_in => '0');
INSERT INTO tokens SELECT 'final', token FROM idempotency.idem_claim('k-final');
SELECT idempotency.idem_fail('k-final', (SELECT token FROM tokens WHERE label = 'final'), 'refused', false);
INSERT INTO tokens SELECT 'expired', token FROM idempotency.idem_claim('k-expired', lease => '100 milliseconds');
INSERT INTO tokens SELECT 'tomb', token FROM idempotency.idem_claim('k-tomb', '{"n": 6}');
SELECT outcome FROM idempotency.idem_complete('k-tomb', (SELECT token FROM tokens WHERE label = 'tomb'), retain => '0');
SELECT idempotency.inbox_receive('m-1', 'orders');
INSERT INTO tokens SELECT 'lock', idempotency.idem_lock('res-1', ttl => '1 hour', owner => 'w1');
INSERT INTO tokens SELECT 'd-1', idempotency.outbox_enqueue('orders', '{"e": "delivered"}', dedup_key => 'd-1');
SELECT idempotency.outbox_enqueue('orders', '{"e": "dead"}');
SELECT idempotency.outbox_enqueue('orders', '{"e": "in flight"}');
SELECT idempotency.outbox_enqueue('orders', '{"e": "first of a"}', key => 'a');
SELECT idempotency.outbox_enqueue('orders', '{"e": "second of a"}', key => 'a');});
# The relay delivers one, kills one and holds one; two wait.
as('relay', 'app', q{
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim('relay-1', 1)));
SELECT idempotency.outbox_nack((SELECT id FROM idempotency.outbox_claim('relay-1', 1)), 'poison', false);
INSERT INTO tokens SELECT 'in_flight', id FROM idempotency.outbox_claim('relay-1', 1);});
# The sweeps: the short lease expires under its holder, the finished key
# past its result's retention becomes a tombstone.
poll_until(10, sub {
	as('idem_owner', 'app', q{SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_leases'}) eq '1';
}) or BAIL_OUT('the short lease did not expire');

is( as('idem_owner', 'app', q{
SELECT string_agg(key || ':' || status, ' ' ORDER BY key) FROM idempotency.idempotency_keys}),
	'k-completed:COMPLETED k-expired:FAILED_RETRYABLE k-final:FAILED_FINAL k-processing:PROCESSING '
	  . 'k-received:RECEIVED k-retry:FAILED_RETRYABLE',
	'before: a key in every state');
is( as('idem_owner', 'app', q{
SELECT string_agg(payload->>'e' || ':' || state, ', ' ORDER BY id) FROM idempotency.outbox}),
	'delivered:delivered, dead:dead, in flight:in_flight, first of a:pending, second of a:pending',
	'before: events in every state');

sub snapshot
{
	my ($db) = @_;
	return as('postgres', $db, q{
SELECT string_agg(t || ' ' || n, E'\n' ORDER BY t) FROM (
  SELECT 'keys' AS t, count(*) || ' ' || md5(string_agg(k::text, '|' ORDER BY k.scope, k.key)) AS n FROM idempotency.idempotency_keys k
  UNION ALL SELECT 'tombstones', count(*) || ' ' || md5(string_agg(s::text, '|' ORDER BY s.key_digest)) FROM idempotency.key_tombstones s
  UNION ALL SELECT 'inbox', count(*) || ' ' || md5(string_agg(i::text, '|' ORDER BY i.source, i.message_id)) FROM idempotency.inbox i
  UNION ALL SELECT 'locks', count(*) || ' ' || md5(string_agg(l::text, '|' ORDER BY l.resource)) FROM idempotency.locks l
  UNION ALL SELECT 'outbox', count(*) || ' ' || md5(string_agg(o::text, '|' ORDER BY o.id)) FROM idempotency.outbox o
  UNION ALL SELECT 'relay_grants', string_agg(g.role::text || '=' || COALESCE(g.topics::text, 'all'), ',' ORDER BY g.role::text) FROM idempotency.relay_grants g
  UNION ALL SELECT 'token_seq', last_value::text FROM idempotency.token_seq) s});
}
my $before = snapshot('app');
like($before, qr/keys 6 .*tombstones 1 /s, 'before: 6 keys and a tombstone');

# ---------------------------------------------------------------- the move

$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-f', $move ],
	'move_to_cpp.sql moves the plain install');
is( as('postgres', 'app', q{SELECT string_agg(extname || ' ' || extversion, ', ') FROM pg_extension WHERE extname LIKE 'idempotency%'}),
	"idempotency $version", 'after: the C++ extension, and no SQL edition');
is(as('postgres', 'app', q{SELECT count(*) FROM pg_proc WHERE proname = 'sql_edition_version'}),
	'0', 'after: none of the edition\'s functions is left');
is(snapshot('app'), $before, 'after: every row, the relay grants and the token sequence as they were');

# ---------------------------------------------------------------- the work goes on

# The live holder's token still fences: its step and its complete count.
is( as('app', 'app', q{
SELECT idempotency.idem_step('k-processing', (SELECT token FROM tokens WHERE label = 'processing'), 'charge', '"ch_2"');
SELECT outcome FROM idempotency.idem_complete('k-processing', (SELECT token FROM tokens WHERE label = 'processing'), '{"ok": 2}');}),
	"2\ncompleted", 'the holder of a claim made before the move records a step and completes');
my ($rc, $out, $err) = $node->psql('app',
	q{SELECT idempotency.idem_complete('k-retry', (SELECT token FROM tokens WHERE label = 'completed'))},
	extra_params => [ '-U', 'app' ]);
like($err, qr/stale token/, 'a token that is not the key\'s is refused (IK001)');
# The retry takes the key over with a new token above all the old ones,
# and resumes after its step.
is( as('app', 'app', q{
SELECT outcome || ' ' || (token > (SELECT max(token) FROM tokens)) || ' ' || attempt || ' ' || (steps->'charge'->>'result')
  FROM idempotency.idem_claim('k-retry', '{"n": 4}');}),
	'claimed true 2 ch_4', 'a takeover after the move: a new token, the next attempt, the finished step');
# The holder whose lease expired before the move still completes late.
is( as('app', 'app', q{
SELECT outcome FROM idempotency.idem_complete('k-expired', (SELECT token FROM tokens WHERE label = 'expired'), '"late"');}),
	'completed', 'a holder whose lease expired before the move completes late');
is( as('app', 'app', q{
SELECT string_agg(outcome || '/' || COALESCE(result::text, '-') || '/' || result_expired, ' ' ORDER BY n) FROM (
  SELECT 1 AS n, * FROM idempotency.idem_claim('k-completed', '{"n": 3}')
  UNION ALL SELECT 2, * FROM idempotency.idem_claim('k-tomb', '{"n": 6}')
  UNION ALL SELECT 3, * FROM idempotency.idem_claim('k-tomb', '{"n": 7}')
  UNION ALL SELECT 4, * FROM idempotency.idem_claim('k-final')
  UNION ALL SELECT 5, * FROM idempotency.idem_claim('k-completed', '{"n": 30}')) a;}),
	'completed/{"charge": 3}/false completed/-/true mismatch/-/true failed/-/false mismatch/-/false',
	'duplicates: the stored result, the tombstone\'s answer, mismatches, the final failure');
is( as('app', 'app', q{SELECT outcome || ' ' || attempt FROM idempotency.idem_claim('k-received', '{"n": 1}')}),
	'claimed 1', 'the registered key is claimed');
is( as('app', 'app', q{
SELECT idempotency.inbox_receive('m-1', 'orders');
SELECT idempotency.idem_lock('res-1') IS NULL;
SELECT idempotency.idem_lock_assert('res-1', (SELECT token FROM tokens WHERE label = 'lock'));
SELECT idempotency.idem_unlock('res-1', (SELECT token FROM tokens WHERE label = 'lock'));}),
	"f\nt\n\nt", 'the inbox row and the lock hold: a duplicate message, a held lock, its token');

# The relay acks the event it held, and drains the rest in key order.
is( as('relay', 'app', q{
SELECT idempotency.outbox_ack(ARRAY[(SELECT token FROM tokens WHERE label = 'in_flight')]);}),
	'1', 'the event in flight before the move is acked after it');
is( as('relay', 'app', q{
CREATE TEMP TABLE claimed AS SELECT * FROM idempotency.outbox_claim('relay-2', 10);
SELECT string_agg(payload->>'e', ',') FROM claimed;
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM claimed));
SELECT string_agg(payload->>'e', ',') FROM idempotency.outbox_claim('relay-2', 10);}),
	"first of a\n1\nsecond of a", 'the pending events of one key come out in their order');
my $last_id = as('postgres', 'app', 'SELECT max(id) FROM idempotency.outbox');
cmp_ok(as('app', 'app', q{SELECT idempotency.outbox_enqueue('orders', '{"e": "new"}')}),
	'>', $last_id, 'a new event id follows the old ones');
is( as('app', 'app', q{
SELECT idempotency.outbox_enqueue('orders', '{"e": "again"}', dedup_key => 'd-1') = (SELECT token FROM tokens WHERE label = 'd-1')}),
	't', 'the dedup key of an event from before the move still deduplicates (its id is returned)');
is( as('admin', 'app', q{SELECT idempotency.outbox_redrive(ARRAY(SELECT id FROM idempotency.outbox_dead_letters))}),
	'1', 'the dead event is redriven');

# The rights of each role.
is( as('postgres', 'app', q{
SELECT string_agg(r || ':' || has_function_privilege(r, 'idempotency.idem_claim(text,jsonb,interval,text,interval)', 'EXECUTE')
                  || has_function_privilege(r, 'idempotency.outbox_claim(text,integer,interval,text[])', 'EXECUTE')
                  || has_table_privilege(r, 'idempotency.idem_stats', 'SELECT')
                  || has_function_privilege(r, 'idempotency.idem_maintenance()', 'EXECUTE'), ' ' ORDER BY r)
  FROM unnest(ARRAY['admin', 'app', 'monitoring', 'relay']) r}),
	'admin:truetruetruetrue app:truefalsefalsefalse monitoring:falsefalsetruefalse relay:falsetruefalsefalse',
	'each role has the rights of its kind again');
is(as('postgres', 'app', q{SELECT string_agg(role::text || '=' || topics::text, ',') FROM idempotency.relay_grants WHERE role = 'relay'::regrole}),
	'relay={orders}', 'the relay keeps its topics');
is(as('postgres', 'app', q{SELECT count(*) > 0 FROM idempotency.idem_maintenance()}), 't', 'the C++ sweeps run');

# ---------------------------------------------------------------- the extension form, and a refusal

$node->safe_psql('postgres', 'CREATE DATABASE app2');
$node->safe_psql('app2', q{
CREATE EXTENSION idempotency_sql;
SELECT outcome FROM idempotency.idem_complete('x', (idempotency.idem_claim('x', '{"n": 1}')).token, '"done"');
SELECT idempotency.outbox_enqueue('orders', '{"e": 1}');
CREATE VIEW mine AS SELECT key FROM idempotency.idempotency_keys;});
my $before2 = snapshot('app2');
($rc, $out, $err) = $node->psql('app2', "\\i $move");
isnt($rc, 0, 'a view of the user\'s over the edition stops the move');
like($err, qr/objects outside schema idempotency depend on the SQL edition: rule _RETURN on view mine/, 'and names it');
is( as('postgres', 'app2', q{SELECT string_agg(extname, ',') FROM pg_extension WHERE extname LIKE 'idempotency%'}),
	'idempotency_sql', 'the refused move changed nothing');
is(snapshot('app2'), $before2, 'the refused move left every row');
$node->safe_psql('app2', 'DROP VIEW mine');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app2'), '-f', $move ],
	'move_to_cpp.sql moves the extension form');
is(snapshot('app2'), $before2, 'after: every row as it was');
is( as('postgres', 'app2', q{SELECT outcome || ' ' || result FROM idempotency.idem_claim('x', '{"n": 1}')}),
	'completed "done"', 'the key answers from the C++ extension');

done_testing();
