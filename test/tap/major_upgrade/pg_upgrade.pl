# An upgrade between PostgreSQL majors with pg_upgrade: a cluster of the
# older major holding keys in every state and outbox events in every state
# (MajorUpgrade.pm) is upgraded to this major; afterwards the rows are the
# same, the sequences of fencing tokens and event ids go on, the claims and
# the relay's calls answer as before, and the background workers run and
# settle a lease that ran out while the cluster was down. The new cluster
# loads the library in pg_upgrade's binary-upgrade mode with its workers
# enabled.
#
# It needs the older major with the extension installed:
#   IDEM_UPGRADE_FROM=/usr/lib/postgresql/15   (its bin/ and lib/)
# `make test-matrix` runs it in a Debian root holding two majors.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/..", $FindBin::RealBin;
use IdemTap;
use MajorUpgrade;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_install = old_install();

# Both clusters with data checksums: 18's initdb turns them on by default,
# and pg_upgrade needs the two to agree.
my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init(extra => ['--data-checksums']);
$old->append_conf('postgresql.conf', idem_conf("idempotency.worker_enabled = off"));
$old->start;
my $old_major = $old->pg_version->major;
my $before = populate($old);
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new');
$new->init(extra => ['--data-checksums']);
$new->append_conf('postgresql.conf', idem_conf());
my $new_major = $new->pg_version->major;
cmp_ok($new_major, '>', $old_major, "upgrading from $old_major to $new_major");

command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $old->config_data('--bindir'),
		'-B', $new->config_data('--bindir'),
		'-s', $new->host,
		'-p', $old->port, '-P', $new->port
	],
	"pg_upgrade from $old_major to $new_major");
$new->start;
check_moved($new, $before, "pg_upgrade from $old_major");

$new->stop;
done_testing();
