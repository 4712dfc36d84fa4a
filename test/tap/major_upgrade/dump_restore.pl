# A move between PostgreSQL majors with pg_dump and pg_restore: database app
# of an older major's cluster, holding keys in every state and outbox events
# in every state (MajorUpgrade.pm), is dumped and restored into a cluster of
# this major with the library preloaded and its workers on. The extension's
# tables are marked for pg_dump (pg_extension_config_dump), so their rows,
# and the positions of the token and event id sequences, come along.
#
# The dump is made with the older major's pg_dump, the tool that matches the
# server it reads. (Debian's 17.12 stores a column option, pg_attver, that a
# newer major's pg_dump copies into the dump and that an 18 released before
# it rejects on restore, for any table.)
#
# It needs the older major with the extension installed:
#   IDEM_UPGRADE_FROM=/usr/lib/postgresql/17   (its bin/ and lib/)
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

my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init;
$old->append_conf('postgresql.conf', idem_conf("idempotency.worker_enabled = off"));
$old->start;
my $old_major = $old->pg_version->major;
my $before = populate($old);

# Versions up to 0.3.0 do not mark their tables: pg_dump keeps only the
# extension's definition, so the checks of the rows are known to fail there.
# From 0.4.0 on every check counts.
our $TODO;
local $TODO = "version $before->{version} does not mark its tables for pg_dump"
  if $before->{version} =~ /^0\.[0-3]\./;
local $MajorUpgrade::TODO = $TODO;

# Every table and sequence of the extension must be marked, or its rows
# stay behind (the outbox's identity sequence too, or restored ids start
# again from 1). Not role_kind_rights: its rows are the install scripts'
# own (which functions each kind of role gets), written again by the
# CREATE EXTENSION of a restore, so pg_dump must not write them.
my $unmarked = $old->safe_psql(
	'app', q{
SELECT coalesce(string_agg(c.relname, ',' ORDER BY c.relname), '')
  FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND c.relkind IN ('r', 'S')
   AND c.oid <> ALL (coalesce(e.extconfig, '{}')) AND c.relname <> 'role_kind_rights'});

is($unmarked, '', 'pg_dump keeps the rows of every table and sequence of the extension');

my $dump = "${PostgreSQL::Test::Utils::tmp_check}/app.dump";
command_ok(
	[
		"$old_install/bin/pg_dump", '-Fc', '-f', $dump,
		'-h', $old->host, '-p', $old->port, 'app'
	],
	"pg_dump of PostgreSQL $old_major");
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->append_conf('postgresql.conf', idem_conf());
$new->start;
my $new_major = $new->pg_version->major;
cmp_ok($new_major, '>', $old_major, "moving from $old_major to $new_major");
$new->safe_psql('postgres', 'CREATE DATABASE app');
command_ok(
	[
		'pg_restore', '--exit-on-error', '-d', 'app',
		'-h', $new->host, '-p', $new->port, $dump
	],
	"pg_restore into PostgreSQL $new_major");
check_moved($new, $before, "pg_dump from $old_major");

$new->stop;
done_testing();
