# Background work for any number of databases on a default server
# (max_worker_processes = 8): twelve databases enqueue outbox events all
# the time, each wanting an outbox notifier, and a 2 s lease ends in each.
# The notifiers stay within idempotency.max_notifiers, every lease is
# expired soon after its end, and a database left without a notifier still
# hears its events (its commits notify themselves). With max_notifiers
# raised so that notifiers take every slot, sweeps still come first: the
# launcher stops a notifier to start one.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $databases = 12;
my @names = map { sprintf('slots_%02d', $_) } 1 .. $databases;
my $node = idem_node('slots', conf => ['max_connections = 50', 'log_statement = none']);
is($node->safe_psql('postgres', 'SHOW max_worker_processes'), '8',
	"PostgreSQL's default max_worker_processes");
is($node->safe_psql('postgres', "SELECT current_setting('idempotency.max_notifiers', true)"),
	'4', 'the default max_notifiers');
$node->safe_psql('postgres', join('', map { "CREATE DATABASE $_;\n" } @names));
$node->safe_psql($_, 'CREATE EXTENSION idempotency') for @names;

# One producer per database: an event every 50 ms, each in its own commit,
# until it is terminated.
my @producers;
for my $db (@names)
{
	my $sql = q{DO $$BEGIN
	  FOR i IN 1 .. 1000000 LOOP
	    PERFORM idempotency.outbox_enqueue('tick', '{}');
	    COMMIT;
	    PERFORM pg_sleep(0.05);
	  END LOOP;
	END$$};
	my ($out, $err) = ('', '');
	push @producers,
	  IPC::Run::start(
		[ 'psql', '-X', '-q', '-d', $node->connstr($db) . ' application_name=producer', '-c', $sql ],
		'>', \$out, '2>', \$err);
}

sub notifiers
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency notifier'");
}

sub producing
{
	return $node->safe_psql('postgres',
		"SELECT count(DISTINCT datname) FROM pg_stat_activity WHERE application_name = 'producer'");
}

ok(poll_until(60, sub { producing() == $databases }), "$databases databases producing");

# Claims a 2 s lease in every database; returns how many were expired within
# 30 s of their end, and the longest time from an end to its expiry.
sub leases_end_everywhere
{
	my ($key) = @_;
	like($node->safe_psql($_, claim_sql($key, '2 seconds')), qr/^claimed/, "$_: a 2 s lease claimed")
	  for @names;
	my %open = map { $_ => 1 } @names;
	poll_until(
		32,
		sub {
			for my $db (keys %open)
			{
				my $row = key_row($node, $db, $key);
				delete $open{$db} if $row && $row->{status} ne 'PROCESSING';
			}
			!%open;
		},
		100);
	my $longest = 0;
	for my $db (grep { !$open{$_} } @names)
	{
		my $delay = $node->safe_psql($db,
			"SELECT extract(epoch FROM updated_at - (claimed_at + interval '2 seconds')) "
			  . "FROM idempotency.idempotency_keys WHERE key = '$key'");
		$longest = $delay if $delay > $longest;
	}
	return ($databases - keys %open, $longest);
}

# --- the default max_notifiers --------------------------------------------------
ok(poll_until(30, sub { notifiers() == 4 }), 'four notifiers run (max_notifiers)');
my $most = 0;
poll_until(
	3,
	sub {
		my $n = notifiers();
		$most = $n if $n > $most;
		0;
	},
	100);
cmp_ok($most, '<=', 4, "never more notifiers than max_notifiers ($most seen over 3 s)");

my ($expired, $longest) = leases_end_everywhere('lease-a');
is($expired, $databases, "a lease ended in each of the $databases databases: each was expired");
diag(sprintf('max_notifiers = 4, %d producing databases: the longest lease end -> expiry %s',
		$databases, fmt_ms($longest)));

# A database without a notifier: its commits announce themselves.
my $lonely = $node->safe_psql('postgres',
	"SELECT d.datname FROM pg_database d WHERE d.datname LIKE 'slots_%' AND NOT EXISTS ("
	  . "SELECT FROM pg_stat_activity a WHERE a.datid = d.oid "
	  . "AND a.backend_type = 'idempotency notifier') ORDER BY 1 LIMIT 1");
isnt($lonely, '', "$lonely has no notifier");
my $listener = $node->background_psql($lonely);
$listener->query_safe('LISTEN idempotency_outbox');
my $heard = poll_until(
	10,
	sub {
		$listener->query('SELECT 1') =~ /Asynchronous notification "idempotency_outbox" with payload "tick"/;
	},
	100);
ok($heard, "$lonely without a notifier: its events are still announced");
$listener->quit;

# --- notifiers in every slot: sweeps come first -------------------------------------
my $offset = -s $node->logfile;
is($node->psql('postgres', 'ALTER SYSTEM SET idempotency.max_notifiers = 32'), 0, 'max_notifiers raised to 32');
$node->reload;
# Notifiers in every slot the two launchers (PostgreSQL's logical
# replication launcher and the extension's) leave of max_worker_processes.
my $free = 8 - $node->safe_psql('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type IN "
	  . "('logical replication launcher', 'idempotency launcher')");
ok(poll_until(60, sub { notifiers() == $free }),
	"with max_notifiers = 32, notifiers take all $free free slots");
($expired, $longest) = leases_end_everywhere('lease-b');
is($expired, $databases, "with every slot taken by notifiers, each of the $databases leases was expired");
diag(sprintf('notifiers in every slot: the longest lease end -> expiry %s', fmt_ms($longest)));
like(slurp_file($node->logfile, $offset), qr/stopping an outbox notifier to free a background worker slot/,
	'the launcher says it stopped a notifier for a sweep');

$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'producer'");
$_->finish for @producers;
$node->stop;
done_testing();
