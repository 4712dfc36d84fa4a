# A recount that begins after a transaction's commit became visible, and
# before that transaction's commit callbacks have run, counts its rows: the
# callback must not add them a second time, even when the recount has
# ended by then (the state is known again). A test module, hold_commit.c,
# built here and loaded into one session after the extension's library,
# holds that session's commits between the two while a file exists.
use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('recount_commit');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# Absolute: the server resolves a relative path from its data directory.
my $dir = abs_path($node->basedir);
my $module = "$dir/hold_commit.so";
my ($cc) = $node->config_data('--cc');
my ($include) = $node->config_data('--includedir-server');
system_or_bail(split(' ', $cc), '-shared', '-fPIC', "-I$include", '-o', $module,
	"$FindBin::RealBin/hold_commit.c");

my $counts = q{SELECT completed || ' ' || counted_by FROM idempotency.idem_stats WHERE scope = 'r'};
my $complete = sub {
	my ($key) = @_;
	return qq{SELECT idempotency.idem_complete('$key', (idempotency.idem_claim('$key', scope => 'r')).token, scope => 'r');};
};

$node->safe_psql('postgres', $complete->('r0'));
ok(poll_until(30, sub { $node->safe_psql('postgres', $counts) eq '1 commits' }),
	'one completed key, kept by the commits');

# The held session: its commits wait, visible, while the file exists.
my $held = $node->background_psql('postgres');
my $held_pid = $held->query_safe('SELECT pg_backend_pid()');
$held->query_safe("LOAD '$module'");
my $hold = "$dir/hold";
$held->query_safe("SET hold_commit.while_file = '$hold'");

# Completes `key` in the held session and returns once its commit is
# visible to other sessions, its callbacks not yet run.
my $complete_held = sub {
	my ($key) = @_;
	open(my $file, '>', $hold) or die "cannot create $hold: $!";
	close($file);
	$held->query_until(qr/sent/, "\\echo sent\n" . $complete->($key) . "\n");
	ok( poll_until(
			30,
			sub {
				$node->safe_psql('postgres',
					qq{SELECT status FROM idempotency.idempotency_keys WHERE scope = 'r' AND key = '$key'})
				  eq 'COMPLETED';
			}),
		"the held commit of $key is visible to other sessions");
};

# Lets the held commit's callbacks run, and waits until it has ended.
my $release = sub {
	unlink($hold) or die "cannot remove $hold: $!";
	ok( poll_until(
			60,
			sub {
				$node->safe_psql('postgres',
					"SELECT state FROM pg_stat_activity WHERE pid = $held_pid") eq 'idle';
			}),
		'the held commit ends');
};

# A recount now: it sees r1 committed, counts it, and ends.
$complete_held->('r1');
$node->safe_psql('postgres', 'SELECT idempotency.request_sweep()');
ok(poll_until(30, sub { $node->safe_psql('postgres', $counts) eq '2 commits' }),
	'a recount counts the held commit\'s key and ends');
$release->();
is($node->safe_psql('postgres', $counts), '2 commits',
	'its commit callback did not count its key a second time');

# And the counts go on from there.
$node->safe_psql('postgres', $complete->('r2'));
is($node->safe_psql('postgres', $counts), '3 commits', 'a later commit adds its key once');

# Another database's recount, while a commit here is held, does not count
# it (it reads its own tables): its callback adds it here.
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION idempotency');
my $other_counts = q{SELECT completed || ' ' || counted_by FROM idempotency.idem_stats WHERE scope = 'o'};
$node->safe_psql('other',
	q{SELECT idempotency.idem_complete('o0', (idempotency.idem_claim('o0', scope => 'o')).token, scope => 'o')});
$complete_held->('r3');
$node->safe_psql('other', 'SELECT idempotency.request_sweep()');
ok(poll_until(30, sub { $node->safe_psql('other', $other_counts) eq '1 commits' }),
	'the other database\'s recount ends');
$release->();
is($node->safe_psql('postgres', $counts), '4 commits',
	'the held commit\'s callback counted its key: the other database\'s recount had not');
$held->quit;

$node->stop;
done_testing();
