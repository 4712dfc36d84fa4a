# Every database, however many: in a cluster of 300 databases, a lease that
# ends in the last one created is expired within about a naptime. With
# idempotency.max_databases smaller than the databases listed, the launcher
# says so in the log, and the databases it has no room for are still served
# (swept every naptime).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $databases = 300;
my $naptime = 0.2;    # seconds, as idem_node sets it
my $node = idem_node('many');

# The seconds from the end of a 1 s lease of KEY in DB to its expiry by a
# worker, or undef when it was not expired within 10 s.
sub expiry_delay { return lease_expiry_delay($node, $_[0], $_[1], 10); }

my $t_setup = time;
$node->safe_psql('postgres',
	join('', map { sprintf("CREATE DATABASE many_%03d STRATEGY FILE_COPY;\n", $_) } 1 .. $databases));
note(sprintf('%d databases created in %.1f s', $databases, time - $t_setup));
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE datname LIKE 'many_%'"),
	$databases, "$databases databases");

my $last = sprintf('many_%03d', $databases);
$node->safe_psql($last, 'CREATE EXTENSION idempotency');
my @delays = on_time_tries(
	$naptime + 1,
	sub {
		my ($try) = @_;
		return expiry_delay($last, 'last') if $try == 1;
		# Each try again in a database created just before, as the first one was.
		my $again = "many_try_$try";
		$node->safe_psql('postgres', "CREATE DATABASE $again STRATEGY FILE_COPY");
		$node->safe_psql($again, 'CREATE EXTENSION idempotency');
		my $delay = expiry_delay($again, 'last');
		$node->safe_psql('postgres', "DROP DATABASE $again");
		return $delay;
	});
ok(defined $delays[0], "$last, the last database created: the lease was expired");
diag(sprintf('lease end -> expiry in the last of %d databases: %s (naptime 200ms)',
		$databases, join(', ', map { fmt_ms($_ // 99) } @delays)));
cmp_ok($delays[-1] // 99, '<', $naptime + 1, 'within about a naptime of its end (one of three tries)');

my $log = slurp_file($node->logfile);
unlike($log, qr/do not fit in idempotency\.max_databases/,
	'with room for every database, no warning about the due table');

# --- more databases than idempotency.max_databases ---------------------------------
# Fewer databases, so that the ones left out (swept every naptime) stay cheap.
$node->safe_psql('postgres',
	join('', map { sprintf("DROP DATABASE many_%03d;\n", $_) } 4 .. $databases - 1));
$node->append_conf('postgresql.conf', "idempotency.max_databases = 2\n");
my $offset = -s $node->logfile;
$node->restart;
ok( poll_until(
		10,
		sub { slurp_file($node->logfile, $offset) =~ /do not fit in idempotency\.max_databases = 2/ }
	),
	'the launcher warns that the databases do not all fit in idempotency.max_databases');
@delays = on_time_tries($naptime + 1, sub { expiry_delay($last, "last-overflow-$_[0]") });
ok(defined $delays[0], "$last: with max_databases = 2 the lease was still expired");
diag(sprintf('lease end -> expiry with 5 databases and max_databases = 2: %s',
		join(', ', map { fmt_ms($_ // 99) } @delays)));
cmp_ok($delays[-1] // 99, '<', $naptime + 1, 'within about a naptime of its end (one of three tries)');

# From the restarted server's start: before it, a worker may have lost a
# race with DROP DATABASE, or been stopped by the restart (exit code 1).
$log = slurp_file($node->logfile, $offset);
$log =~ s/\A.*?database system is ready to accept connections//s
  or die 'the log has no "ready to accept connections" after the restart';
unlike($log, qr/background worker "idempotency worker" \(PID \d+\) exited with exit code [1-9]/,
	'no worker error logged');
$node->stop;
done_testing();
