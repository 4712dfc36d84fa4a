# A logical backup keeps everything: pg_dump writes the rows of every table
# of the extension and the values of its sequences, so a restore keeps every
# key and stored result, outbox event, inbox row, lock and relay grant, and
# new tokens and event ids continue above the old ones.
#
# A database is filled with keys in all five states, outbox events in every
# state (pending, in flight, delivered, dead, and one delayed), inbox rows, a
# lock and a relay grant with topics, then dumped three ways, each restored
# into a fresh database as a user would:
#   full     pg_dump -Fc DB; pg_restore -d NEW. The dump holds CREATE
#            EXTENSION, the rows, the sequence values and the privileges
#            granted on the extension's functions: nothing else to do.
#   data     pg_dump --data-only DB; CREATE EXTENSION idempotency in NEW,
#            then psql -f the dump. Rows and sequence values, no privileges:
#            the grant_* calls are run again.
#   schema   pg_dump -Fc -n idempotency DB. pg_dump writes extensions only
#            in a whole-database dump: this one holds the schema, the rows
#            and the sequence values but no CREATE EXTENSION (restored alone
#            it fails). CREATE EXTENSION idempotency in NEW, then
#            pg_restore --data-only, then the grant_* calls again.
# Each restored database must hold the same rows, replay a completed key's
# result, hand its pending events to a relay, give tokens and event ids above
# every old one, and be served by the background worker.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('backup');
my $dir = PostgreSQL::Test::Utils::tempdir;
my $relay_topics = q{ARRAY['orders', 'bills']};

$node->safe_psql(
	'postgres', q{
CREATE ROLE app LOGIN;
CREATE ROLE relay LOGIN;
CREATE DATABASE src;});

# The roles' rights, as the extension's owner gives them.
sub grant_roles
{
	my ($db) = @_;
	$node->safe_psql(
		$db, qq{
SELECT idempotency.grant_application('app');
SELECT idempotency.grant_relay('relay', $relay_topics);});
}

sub as_role
{
	my ($role, $db, $sql) = @_;
	return $node->psql($db, $sql, extra_params => [ '-U', $role ]);
}

# No worker may change the database between the fill and the dump: the
# workers are paused (a key whose lease ends is left PROCESSING for the
# restored databases' workers to expire).
$node->safe_psql('postgres',
	'ALTER SYSTEM SET idempotency.worker_enabled = off; SELECT pg_reload_conf()');
ok( poll_until(15, sub { wait_for_backend($node, 'idempotency worker', undef, 1) eq '' }),
	'the workers are paused');

$node->safe_psql('src', 'CREATE EXTENSION idempotency');
grant_roles('src');
my ($rc, $out, $err) = as_role(
	'app', 'src', q{
SELECT idempotency.idem_register('k-received', '{"a": 1}', 'job-1');
SELECT idempotency.idem_claim('k-processing', NULL, '1 hour');
SELECT idempotency.idem_claim('k-lapsing', NULL, '1 second');
SELECT idempotency.idem_step('k-stepped', (idempotency.idem_claim('k-stepped', NULL, '1 second')).token,
                             'reserve', '{"reserved": 2}');
SELECT idempotency.idem_complete('k-completed', (idempotency.idem_claim('k-completed', '{"n": 1}')).token,
                                 '{"charge": 77}');
SELECT idempotency.idem_fail('k-retryable', (idempotency.idem_claim('k-retryable')).token, 'boom', true, '1 hour');
SELECT idempotency.idem_fail('k-final', (idempotency.idem_claim('k-final')).token, 'fatal', false);
SELECT idempotency.outbox_enqueue('orders', '{"e": "delivered"}');
SELECT idempotency.outbox_enqueue('orders', '{"e": "dead"}');
SELECT idempotency.outbox_enqueue('orders', '{"e": "in flight"}');
SELECT idempotency.outbox_enqueue('bills', '{"e": "pending"}', 'customer-1');
SELECT idempotency.outbox_enqueue('bills', '{"e": "delayed"}', deliver_at => now() + interval '1 hour');
SELECT idempotency.outbox_enqueue('audit', '{"e": "not the relay''s topic"}');
SELECT idempotency.inbox_receive('msg-1', 'payments', '{"x": 1}');
SELECT idempotency.inbox_receive('msg-2', 'payments');
SELECT idempotency.idem_lock('printer', '1 hour', 'alice') IS NOT NULL;});
is($rc, 0, 'src: keys, events, inbox rows and a lock made by the application role') or diag($err);
($rc, $out, $err) = as_role(
	'relay', 'src', q{
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim('relay-1', 1)));
SELECT idempotency.outbox_nack((SELECT id FROM idempotency.outbox_claim('relay-1', 1)), 'gone', false);
SELECT count(*) FROM idempotency.outbox_claim('relay-1', 1, '1 hour');});
is($out, "1\ndead\n1", 'src: the relay delivered one event, gave up on one and holds one') or diag($err);

# What must come back: every row of every table and the sequences' values.
my @tables = qw(idempotency_keys outbox inbox locks relay_grants);
sub snapshot
{
	my ($db) = @_;
	my %rows;
	for my $table (@tables)
	{
		$rows{$table} = $node->safe_psql($db,
			"SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM idempotency.$table t");
	}
	$rows{sequences} = $node->safe_psql(
		$db, q{
SELECT (SELECT last_value || ' ' || is_called FROM idempotency.token_seq) || ', '
       || (SELECT last_value || ' ' || is_called FROM idempotency.outbox_id_seq)});
	return \%rows;
}
my $before = snapshot('src');
is( $node->safe_psql(
		'src', q{SELECT string_agg(DISTINCT status::text, ',' ORDER BY status::text) FROM idempotency.idempotency_keys}),
	'COMPLETED,FAILED_FINAL,FAILED_RETRYABLE,PROCESSING,RECEIVED',
	'src: keys in all five states');
is( $node->safe_psql(
		'src', q{
SELECT string_agg(state || CASE WHEN available_at > now() THEN ' (delayed)' ELSE '' END, ',' ORDER BY id)
  FROM idempotency.outbox}),
	'delivered,dead,in_flight,pending,pending (delayed),pending',
	'src: outbox events in every state, one delayed');
my $max_token = $node->safe_psql('src',
	'SELECT greatest((SELECT max(token) FROM idempotency.idempotency_keys), (SELECT max(token) FROM idempotency.locks))');
my $max_id = $node->safe_psql('src', 'SELECT max(id) FROM idempotency.outbox');

# --- the three dumps, restored ----------------------------------------------------
my $pg_bin = sub { return [ $_[0], '-d', $node->connstr($_[1]), @_[ 2 .. $#_ ] ] };
command_ok($pg_bin->('pg_dump', 'src', '-Fc', '-f', "$dir/full.dump"), 'pg_dump -Fc');
command_ok($pg_bin->('pg_dump', 'src', '--data-only', '-f', "$dir/data.sql"), 'pg_dump --data-only');
command_ok($pg_bin->('pg_dump', 'src', '-Fc', '-n', 'idempotency', '-f', "$dir/schema.dump"),
	'pg_dump -Fc -n idempotency');

$node->safe_psql('postgres', 'CREATE DATABASE r_full; CREATE DATABASE r_data; CREATE DATABASE r_schema; '
	  . 'CREATE DATABASE r_schema_alone');

command_ok($pg_bin->('pg_restore', 'r_full', '--exit-on-error', "$dir/full.dump"),
	'full: pg_restore into a fresh database');

# The views' counts are known (empty) before the rows arrive, as when the
# worker recounts between CREATE EXTENSION and the load.
$node->safe_psql('r_data', 'CREATE EXTENSION idempotency; SELECT count(*) FROM idempotency.idem_stats');
command_ok($pg_bin->('psql', 'r_data', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', "$dir/data.sql"),
	'data: psql -f the data-only dump into a fresh database with the extension');

my $toc = `pg_restore -l "$dir/schema.dump"`;
unlike($toc, qr/ EXTENSION /, 'schema: the -n dump holds no CREATE EXTENSION');
like($toc, qr/TABLE DATA idempotency idempotency_keys/, '... but the rows of the tables');
like($toc, qr/SEQUENCE SET idempotency token_seq/, '... and the values of the sequences');
command_fails($pg_bin->('pg_restore', 'r_schema_alone', '--exit-on-error', "$dir/schema.dump"),
	'schema: restored alone into an empty database, it fails');
$node->safe_psql('r_schema', 'CREATE EXTENSION idempotency; SELECT count(*) FROM idempotency.outbox_lag');
command_ok(
	$pg_bin->('pg_restore', 'r_schema', '--data-only', '--exit-on-error', "$dir/schema.dump"),
	'schema: pg_restore --data-only into a fresh database with the extension');

# --- what each restore brought back --------------------------------------------
for my $db (qw(r_full r_data r_schema))
{
	my $after = snapshot($db);
	is($after->{$_}, $before->{$_}, "$db: every row of $_ is back") for @tables;
	is($after->{sequences}, $before->{sequences}, "$db: token_seq and the outbox ids continue where they were");
}

# The rows were written behind the functions: request_sweep(), as the
# restore's last step, has the views' counts made again from the tables.
my $counts_agree = q{
SELECT (SELECT coalesce(string_agg(concat_ws(' ', scope, completed, failed_retryable, failed_final), ',' ORDER BY scope), '')
          FROM idempotency.idem_stats WHERE completed + failed_retryable + failed_final > 0)
     = (SELECT coalesce(string_agg(concat_ws(' ', scope, c, r, f), ',' ORDER BY scope), '')
          FROM (SELECT scope, count(*) FILTER (WHERE status = 'COMPLETED') c,
                       count(*) FILTER (WHERE status = 'FAILED_RETRYABLE') r,
                       count(*) FILTER (WHERE status = 'FAILED_FINAL') f
                  FROM idempotency.idempotency_keys GROUP BY scope) k WHERE c + r + f > 0)
   AND (SELECT coalesce(string_agg(concat_ws(' ', topic, pending + in_flight + retrying, dead), ',' ORDER BY topic), '')
          FROM idempotency.outbox_lag WHERE pending + in_flight + retrying + dead > 0)
     = (SELECT coalesce(string_agg(concat_ws(' ', topic, u, d), ',' ORDER BY topic), '')
          FROM (SELECT topic, count(*) FILTER (WHERE state IN ('pending', 'in_flight')) u,
                       count(*) FILTER (WHERE state = 'dead') d
                  FROM idempotency.outbox GROUP BY topic) o WHERE u + d > 0)};
for my $db (qw(r_full r_data r_schema))
{
	$node->safe_psql($db, 'SELECT idempotency.request_sweep()');
	ok(poll_until(10, sub { $node->safe_psql($db, $counts_agree) eq 't' }),
		"$db: after request_sweep(), idem_stats and outbox_lag count the restored rows");
}

# The privileges on the functions come back with the full dump only.
($rc, $out, $err) = as_role('relay', 'r_full', q{SELECT count(*) FROM idempotency.outbox_lag});
is($rc, 0, 'r_full: the relay role keeps its rights') or diag($err);
for my $db (qw(r_data r_schema))
{
	($rc, $out, $err) = as_role('relay', $db, q{SELECT count(*) FROM idempotency.outbox_claim('relay-2', 10)});
	like($err, qr/permission denied/, "$db: the rights are not in the dump ...");
	grant_roles($db);
	pass("$db: ... and are granted again with the grant_* functions");
}

for my $db (qw(r_full r_data r_schema))
{
	($rc, $out, $err) = as_role('app', $db,
		q{SELECT outcome || ' ' || result::text FROM idempotency.idem_claim('k-completed', '{"n": 1}')});
	is($out, 'completed {"charge": 77}', "$db: a completed key replays its stored result") or diag($err);
	# A key's finished steps come back with it: the takeover of its ended
	# lease resumes after them.
	ok( poll_until(
			10,
			sub {
				($rc, $out, $err) = as_role('app', $db,
					q{SELECT outcome || ' ' || (steps->'reserve'->'result')::text FROM idempotency.idem_claim('k-stepped')});
				($out // '') ne '';    # in_progress has no steps: an empty line
			}),
		"$db: the stepped key's lease ends");
	is($out, 'claimed {"reserved": 2}', "$db: its finished step is restored; the takeover gets it") or diag($err);
	($rc, $out, $err) = as_role('app', $db,
		q{SELECT outcome || ' ' || job_ref FROM idempotency.idem_register('k-received')});
	is($out, 'in_progress job-1', "$db: a registered key is still there") or diag($err);
	($rc, $out, $err) = as_role('app', $db,
		q{SELECT idempotency.inbox_receive('msg-1', 'payments')::text || ' '
		   || (idempotency.idem_lock('printer') IS NULL)::text});
	is($out, 'false true', "$db: an inbox row is still a duplicate, the lock still held") or diag($err);
	# Pending, due and of the relay's topics: only the 'bills' event; not the
	# delayed one, the one in flight, the dead or delivered ones, or 'audit'.
	($rc, $out, $err) = as_role('relay', $db,
		q{SELECT string_agg(topic || ' ' || payload::text, ',') FROM idempotency.outbox_claim('relay-2', 10)});
	is($out, 'bills {"e": "pending"}', "$db: the pending event is handed to the relay") or diag($err);
	($rc, $out, $err) = as_role(
		'app', $db, q{
SELECT (SELECT token FROM idempotency.idem_claim('k-new')) || ' '
       || idempotency.idem_lock('scanner') || ' '
       || idempotency.outbox_enqueue('orders', '{"e": "new"}')});
	my ($key_token, $lock_token, $id) = split / /, $out // '';
	ok(defined $id && $key_token > $max_token && $lock_token > $max_token,
		"$db: new tokens ($key_token, $lock_token) are above every old one ($max_token)") or diag($err);
	ok(defined $id && $id > $max_id, "$db: a new event id ($id) is above every old one ($max_id)");
}

# --- the background worker serves the restored databases -----------------------
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET idempotency.worker_enabled; SELECT pg_reload_conf()');
for my $db (qw(r_full r_data r_schema))
{
	ok( poll_until(
			20,
			sub {
				my $row = key_row($node, $db, 'k-lapsing');
				$row && $row->{status} eq 'FAILED_RETRYABLE' && $row->{last_error} eq 'lease expired';
			}),
		"$db: the worker expires the restored key whose lease ended");
	is(key_row($node, $db, 'k-processing')->{status}, 'PROCESSING', "$db: a lease that has not ended is kept");
}

$node->stop;
done_testing();
