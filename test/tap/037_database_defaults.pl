# Defaults a DBA sets on a database (ALTER DATABASE ... SET) reach the
# extension's background workers as they reach any session there.
#
# Those meant for the applications' sessions are put back for the workers:
# in a database whose transactions default to REPEATABLE READ and whose
# lock_timeout is 1 ms, the sweep that expires a lease runs under READ
# COMMITTED and without a lock timeout (a statement trigger on the keys
# table records what the updating transaction runs under).
#
# A database fenced read-only (default_transaction_read_only, as on an old
# primary at a switchover) is left alone: its workers write nothing there,
# fail with no error, and say so in one log line while the fence holds, and
# in one more when it is lifted; then the lease that ended meanwhile is
# expired.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('defaults', conf => ['log_min_messages = debug1']);

# --- a database with application defaults ------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE levels');
$node->safe_psql(
	'levels', q{
CREATE EXTENSION idempotency;
CREATE TABLE public.seen (backend text, isolation text, lock_timeout text);
CREATE FUNCTION public.note_settings() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.seen
  SELECT backend_type, current_setting('transaction_isolation'), current_setting('lock_timeout')
    FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid();
  RETURN NULL;
END $$;
CREATE TRIGGER note_settings AFTER UPDATE ON idempotency.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION public.note_settings();
ALTER DATABASE levels SET default_transaction_isolation = 'repeatable read';
ALTER DATABASE levels SET lock_timeout = '1ms';
});
is( $node->safe_psql('levels', 'SHOW default_transaction_isolation'),
	'repeatable read',
	'a session of the database gets its default isolation');
like($node->safe_psql('levels', claim_sql('lease-ends', '300 milliseconds')),
	qr/^claimed\|/, 'a key claimed with a 300 ms lease');
# Waits for the expiry itself: a statement trigger also fires for a sweep's
# UPDATE that changes no row, such as the first sweep of the database,
# which may come before the lease ends.
ok( poll_until(30, sub { key_row($node, 'levels', 'lease-ends')->{status} eq 'FAILED_RETRYABLE' }),
	'the worker expired the lease');
is( $node->safe_psql(
		'levels',
		"SELECT string_agg(DISTINCT isolation || ' / ' || lock_timeout, ', ')
		   FROM public.seen WHERE backend = 'idempotency worker'"),
	'read committed / 0',
	"the worker's transactions run under READ COMMITTED, without a lock timeout");

# --- a fenced database ------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE fenced');
$node->safe_psql('fenced', 'CREATE EXTENSION idempotency');
ok(defined wait_served($node, 'fenced', 30), 'the fenced database is served before its fence');
my $oid = $node->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = 'fenced'");
like($node->safe_psql('fenced', claim_sql('held', '2 seconds')), qr/^claimed\|/,
	'a key claimed with a 2 s lease');
my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'ALTER DATABASE fenced SET default_transaction_read_only = on');

my $fence_line = qr/idempotency worker: database "fenced" is read-only/;
sub log_since { return slurp_file($node->logfile, $offset); }
sub count_of { my ($re) = @_; my $n = () = log_since() =~ /$re/g; return $n; }
# Workers started for the database since the offset (the launcher's debug line).
sub starts { return count_of(qr/idempotency launcher: worker for database $oid: /); }

ok(poll_until(60, sub { count_of($fence_line) > 0 }), 'the worker says the database is fenced');
# The lease has ended, and the launcher keeps starting workers for the due
# expiry: five more of them after the line find the fence in place.
my $starts_at_line = starts();
ok(poll_until(90, sub { starts() >= $starts_at_line + 5 && key_row($node, 'fenced', 'held')->{lease_over} }),
	'five more workers start while the fence holds, after the lease ended');
is(key_row($node, 'fenced', 'held')->{status}, 'PROCESSING', 'no worker expired the lease behind the fence');
is(count_of($fence_line), 1, 'the fence is said once');
is(count_of(qr/ERROR:.*read-only transaction/), 0, 'no worker failed on the fence');
is( $node->safe_psql('fenced', 'SHOW default_transaction_read_only'),
	'on', 'a session of the database is read-only');

$node->safe_psql('postgres', 'ALTER DATABASE fenced RESET default_transaction_read_only');
ok( poll_until(60, sub { key_row($node, 'fenced', 'held')->{status} ne 'PROCESSING' }),
	'once the fence is lifted, the lease is expired');
is(key_row($node, 'fenced', 'held')->{status}, 'FAILED_RETRYABLE', 'the key is expired');
is(count_of(qr/idempotency worker: database "fenced" is writable again/),
	1, 'the end of the fence is said once');

$node->stop;
done_testing();
