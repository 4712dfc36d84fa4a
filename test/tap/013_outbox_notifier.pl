# The outbox notifier: with the library preloaded, outbox_enqueue does not
# NOTIFY in the caller's transaction (that serialises commits); the
# database's `idempotency notifier` sends one NOTIFY per topic after the
# commit. Every committed enqueue must still be followed by a NOTIFY with its
# topic, and nothing may be announced for an enqueue that rolled back:
#
# - the first enqueue (no notifier yet) notifies in its own commit and asks
#   for a notifier; later ones are announced by the notifier, after the
#   commit, never before it, never for a rollback;
# - more distinct topics than a notifier slot holds, in one transaction and
#   from concurrent producers: the others announced as "*" by the notifier;
# - the notifier leaving after idling, on SIGTERM, and killed with kill -9
#   (crash restart): no commit after it goes unannounced;
# - a prepared transaction: announced by COMMIT PREPARED, from its session,
#   never at PREPARE, never for ROLLBACK PREPARED; "*" past eight topics;
# - a savepoint rolled back takes its topics back;
# - idempotency.worker_enabled = off: notified in the caller's commit;
# - DROP DATABASE, CREATE DATABASE ... TEMPLATE and ALTER DATABASE ...
#   RENAME succeed while a notifier is connected;
# - without preload: notified in the caller's commit, as before.
#
# "Not announced" is checked against a barrier: a later committed enqueue
# whose notification has been heard; no assertion depends on timing.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# A session that LISTENs; heard notifications are kept as topic => sender pid.
sub listener
{
	my ($node, $db) = @_;
	my $session = $node->background_psql($db // 'postgres');
	$session->query_safe('LISTEN idempotency_outbox');
	return { session => $session, heard => {}, pid => $session->query_safe('SELECT pg_backend_pid()') };
}

sub collect
{
	my ($l) = @_;
	my $out = $l->{session}->query('SELECT 1');
	while ($out =~ /Asynchronous notification "idempotency_outbox" with payload "([^"]*)" received from server process with PID (\d+)/g)
	{
		$l->{heard}{$1} //= $2;
	}
}

# The pid that announced TOPIC, or '' when it was not heard within 30 s.
sub hear
{
	my ($l, $topic) = @_;
	poll_until(30, sub { collect($l); exists $l->{heard}{$topic} }, 20);
	return $l->{heard}{$topic} // '';
}

# Every topic of LIST heard within 30 s?
sub hear_all
{
	my ($l, @topics) = @_;
	return poll_until(30, sub { collect($l); !grep { !exists $l->{heard}{$_} } @topics }, 50);
}

sub enqueue_sql { return "SELECT idempotency.outbox_enqueue('$_[0]', '{}') IS NOT NULL"; }

my $barriers = 0;
# Commits an enqueue on a fresh topic and waits until it is heard: whatever
# was announced before it has been heard too.
sub barrier
{
	my ($node, $l, $db) = @_;
	my $topic = 'barrier-' . ++$barriers;
	$node->safe_psql($db // 'postgres', enqueue_sql($topic));
	return hear($l, $topic) ne '';
}

sub notifier_pid { return wait_for_backend($_[0], 'idempotency notifier', $_[1] // 'postgres', $_[2] // 10); }

# A notifier idles 30 s before it leaves (launcher_naptime), not the 1 s of
# idem_node, but in the section on idling: on a busy machine, the notifier
# a check names must still be there at the commits that follow.
my $node = idem_node('notifier',
	conf => [ "max_prepared_transactions = 2", "idempotency.launcher_naptime = '30s'" ]);
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $l = listener($node);
my $producer = $node->background_psql('postgres');
my $producer_pid = $producer->query_safe('SELECT pg_backend_pid()');

# --- first enqueue, then the notifier --------------------------------------
$producer->query_safe(enqueue_sql('first'));
is(hear($l, 'first'), $producer_pid,
	'without a notifier yet, the enqueue is announced by its own commit');
my $notifier = notifier_pid($node);
isnt($notifier, '', 'a notifier was started for the database');
$producer->query_safe(enqueue_sql('second'));
is(hear($l, 'second'), $notifier, 'the next commit is announced by the notifier');

# --- after the commit, not before it, not after a rollback -----------------
$producer->query_safe('BEGIN');
$producer->query_safe(enqueue_sql('open-1'));
ok(barrier($node, $l), 'barrier heard while open-1 is uncommitted');
ok(!exists $l->{heard}{'open-1'}, 'an uncommitted enqueue is not announced');
$producer->query_safe('COMMIT');
is(hear($l, 'open-1'), $notifier, 'it is announced once committed');

$producer->query_safe('BEGIN');
$producer->query_safe(enqueue_sql('rolled-back-1'));
$producer->query_safe('ROLLBACK');
$producer->query_safe('BEGIN');
$producer->query_safe(enqueue_sql('kept-1'));
$producer->query_safe('SAVEPOINT s');
$producer->query_safe(enqueue_sql('kept-2'));
$producer->query_safe('ROLLBACK TO SAVEPOINT s');
$producer->query_safe('COMMIT');
ok(hear($l, 'kept-1') ne '', 'a transaction with a rolled-back savepoint announces its committed topic');
ok(barrier($node, $l), 'barrier heard after the rollback');
ok(!exists $l->{heard}{'rolled-back-1'}, 'a rolled-back enqueue is never announced');
ok(!exists $l->{heard}{'kept-2'}, 'nor the enqueue of a rolled-back savepoint');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.outbox WHERE topic = 'rolled-back-1'"),
	'0', 'and left no event');

# --- many distinct topics ---------------------------------------------------
# A slot holds 64 topics; a commit with more is announced as "*" (any
# topic), by the notifier: a commit never notifies itself, however many
# topics it has.
my @wide = map { "wide-$_" } 1 .. 100;
ok(barrier($node, $l), 'barrier heard before the wide transaction');
$notifier = notifier_pid($node);
delete $l->{heard}{'*'};
$producer->query_safe('BEGIN');
$producer->query_safe(enqueue_sql($_)) for @wide;
$producer->query_safe('COMMIT');
is(hear($l, '*'), $notifier, 'one transaction with 100 distinct topics: "*" announced by the notifier');
is(scalar(grep { exists $l->{heard}{$_} && $l->{heard}{$_} ne $notifier } @wide), 0,
	'nothing of it announced by the committing session');

# Concurrent producers, 300 distinct topics: more than a slot holds at once.
my $script = $node->basedir . '/many_topics.sql';
append_to_file($script,
	"\\set t random(1, 300)\nSELECT idempotency.outbox_enqueue('many-' || :t, '{}');\n");
delete $l->{heard}{'*'};
$node->command_ok(
	[ 'pgbench', '-n', '-c', '8', '-j', '2', '-t', '150', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'8 producers enqueue on 300 topics');
my @many = split /\n/, $node->safe_psql('postgres',
	"SELECT DISTINCT topic FROM idempotency.outbox WHERE topic LIKE 'many-%'");
# Each topic by name, or "*" after it.
ok(barrier($node, $l), 'barrier heard after the 300-topic run');
my @unheard = grep { !exists $l->{heard}{$_} } @many;
ok(@unheard == 0 || exists $l->{heard}{'*'},
	scalar(@many) . ' distinct topics of concurrent commits: every topic announced, by name or as "*"');

# --- the notifier leaves after idling (launcher_naptime, 1 s for this) -----
$node->append_conf('postgresql.conf', "idempotency.launcher_naptime = '1s'");
$node->reload;
ok(poll_until(30, sub { backend_pid($node, 'idempotency notifier') eq '' }),
	'an idle notifier leaves');
$node->append_conf('postgresql.conf', "idempotency.launcher_naptime = '30s'");
$node->reload;
$producer->query_safe(enqueue_sql('after-idle-1'));
ok(hear($l, 'after-idle-1') ne '', 'the first commit after it left is announced');
$notifier = notifier_pid($node);
isnt($notifier, '', 'and a notifier is started again');
$producer->query_safe(enqueue_sql('after-idle-2'));
is(hear($l, 'after-idle-2'), $notifier, 'which announces the next commit');

# --- SIGTERM: commits right after it are announced --------------------------
ok(kill('TERM', $notifier), 'SIGTERM to the notifier');
my @after_term = map { "after-term-$_" } 1 .. 20;
$producer->query_safe(enqueue_sql($_)) for @after_term;
ok(hear_all($l, @after_term), 'every commit after the SIGTERM is announced');
# A notifier leaves after idling a second: each look for the new one comes
# with a commit, so that on a busy machine it is not gone before it is seen.
my $replaced = '';
ok( poll_until(
		30,
		sub {
			$producer->query_safe(enqueue_sql('after-term-look'));
			$replaced = backend_pid($node, 'idempotency notifier');
			$replaced ne '' && $replaced ne $notifier;
		}),
	'a new notifier replaces it');
$producer->query_safe(enqueue_sql('after-term-last'));
ok(hear($l, 'after-term-last') ne '', 'and commits are announced');

# --- kill -9: crash restart, then no wake-up is lost ------------------------
my $killed = $replaced;
$producer->quit;
$l->{session}->quit;
ok(kill('KILL', $killed), 'kill -9 of the notifier');
ok(defined wait_until_up($node), 'the cluster is back after the crash restart');
$l = listener($node);
my @after_kill = map { "after-kill-$_" } 1 .. 10;
$node->safe_psql('postgres', enqueue_sql($_)) for @after_kill;
ok(hear_all($l, @after_kill), 'every commit after the crash restart is announced');
$notifier = notifier_pid($node, 'postgres', 30);
isnt($notifier, '', 'a notifier runs again after the crash restart');
$node->safe_psql('postgres', enqueue_sql('after-kill-last'));
is(hear($l, 'after-kill-last'), $notifier, 'and announces commits');

# --- PREPARE TRANSACTION ------------------------------------------------------
# A prepared transaction's topics are announced by the session that runs
# COMMIT PREPARED, in its own commit; ROLLBACK PREPARED announces nothing.
my $committer = $node->background_psql('postgres');
my $committer_pid = $committer->query_safe('SELECT pg_backend_pid()');
$node->safe_psql('postgres', "BEGIN; " . enqueue_sql('prepared-1') . "; PREPARE TRANSACTION 'p1';");
ok(barrier($node, $l), 'a commit after PREPARE TRANSACTION is heard');
ok(!exists $l->{heard}{'prepared-1'}, 'nothing is announced at PREPARE');
$committer->query_safe("COMMIT PREPARED 'p1'");
is(hear($l, 'prepared-1'), $committer_pid, 'COMMIT PREPARED announces the topic, from its session');

$node->safe_psql('postgres', "BEGIN; " . enqueue_sql('prepared-2') . "; PREPARE TRANSACTION 'p2';");
$node->safe_psql('postgres', "ROLLBACK PREPARED 'p2'");
ok(barrier($node, $l), 'a commit after ROLLBACK PREPARED is heard');
ok(!exists $l->{heard}{'prepared-2'}, 'ROLLBACK PREPARED announces nothing');

# A savepoint rolled back takes its topic back.
$node->safe_psql('postgres', "BEGIN; SAVEPOINT a; " . enqueue_sql('prepared-kept') . "; RELEASE SAVEPOINT a; "
	  . "SAVEPOINT b; " . enqueue_sql('prepared-dropped') . "; ROLLBACK TO SAVEPOINT b; PREPARE TRANSACTION 'p0';");
$node->safe_psql('postgres', "COMMIT PREPARED 'p0'");
ok(hear($l, 'prepared-kept') ne '' && barrier($node, $l) && !exists $l->{heard}{'prepared-dropped'},
	'prepared: a released savepoint\'s topic is announced, a rolled-back one\'s is not');

# Two prepared at once: each is announced when it commits, not before.
$node->safe_psql('postgres', "BEGIN; " . enqueue_sql('prepared-3') . "; PREPARE TRANSACTION 'p3';");
$node->safe_psql('postgres', "BEGIN; " . enqueue_sql('prepared-4') . "; PREPARE TRANSACTION 'p4';");
$committer->query_safe("COMMIT PREPARED 'p4'");
is(hear($l, 'prepared-4'), $committer_pid, 'the second prepared, committed first, is announced');
ok(barrier($node, $l) && !exists $l->{heard}{'prepared-3'}, 'the first, still prepared, is not');
$committer->query_safe("COMMIT PREPARED 'p3'");
is(hear($l, 'prepared-3'), $committer_pid, 'and is announced once committed');

# More topics than a prepared transaction keeps: "*" stands for the rest.
delete $l->{heard}{'*'};
$node->safe_psql('postgres', "BEGIN; " . join('; ', map { enqueue_sql("prepared-many-$_") } 1 .. 10)
	  . "; PREPARE TRANSACTION 'p5';");
$committer->query_safe("COMMIT PREPARED 'p5'");
ok(hear_all($l, (map { "prepared-many-$_" } 1 .. 8), '*'), 'past eight topics, one "*" for the rest');
$committer->quit;

$node->safe_psql('postgres', "BEGIN; SET LOCAL idempotency.outbox_notify = off; "
	  . enqueue_sql('prepared-quiet') . "; PREPARE TRANSACTION 'p6';");
$node->safe_psql('postgres', "COMMIT PREPARED 'p6'");
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.outbox WHERE topic = 'prepared-quiet'"),
	'1', 'with SET LOCAL idempotency.outbox_notify = off it prepares and commits');
ok(barrier($node, $l) && !exists $l->{heard}{'prepared-quiet'}, 'and announces nothing');

# --- worker_enabled = off -----------------------------------------------------
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.worker_enabled = off');
$node->reload;
ok(poll_until(30, sub { backend_pid($node, 'idempotency notifier') eq '' }),
	'worker_enabled = off: the notifier leaves');
my $session = $node->background_psql('postgres');
my $session_pid = $session->query_safe('SELECT pg_backend_pid()');
$session->query_safe(enqueue_sql('disabled-1'));
is(hear($l, 'disabled-1'), $session_pid, 'worker_enabled = off: announced by the committing session');
$node->safe_psql('postgres', "BEGIN; " . enqueue_sql('disabled-prepared') . "; PREPARE TRANSACTION 'p7';");
$session->query_safe("COMMIT PREPARED 'p7'");
is(hear($l, 'disabled-prepared'), $session_pid, 'worker_enabled = off: a prepared one by COMMIT PREPARED');
$session->quit;
$node->safe_psql('postgres', 'ALTER SYSTEM RESET idempotency.worker_enabled');
$node->reload;

# --- DROP DATABASE with a notifier connected ---------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE dropme');
$node->safe_psql('dropme', 'CREATE EXTENSION idempotency');
$node->safe_psql('dropme', enqueue_sql('d1'));
isnt(notifier_pid($node, 'dropme'), '', 'a notifier is connected to dropme');
# The other commands that need a database without sessions: a copy of it
# (CREATE DATABASE ... TEMPLATE, as a staging copy is made) and a rename.
my ($rc, $out, $err) = $node->psql('postgres', 'CREATE DATABASE dropme_copy TEMPLATE dropme');
is($rc, 0, 'CREATE DATABASE ... TEMPLATE succeeds while a notifier is connected') or diag($err);
$node->safe_psql('dropme', enqueue_sql('d2'));
isnt(notifier_pid($node, 'dropme'), '', 'a notifier is connected to dropme again');
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE dropme RENAME TO dropme_renamed');
is($rc, 0, 'ALTER DATABASE ... RENAME succeeds while a notifier is connected') or diag($err);
$node->safe_psql('dropme_renamed', enqueue_sql('d3'));
isnt(notifier_pid($node, 'dropme_renamed'), '', 'a notifier is connected to the renamed database');
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE dropme_renamed');
is($rc, 0, 'DROP DATABASE succeeds while a notifier is connected') or diag($err);
$node->safe_psql('postgres', 'DROP DATABASE dropme_copy');

$l->{session}->quit;
my $log = slurp_file($node->logfile);
my @crashed = $log =~ /\(PID (\d+)\) was terminated by signal/g;
is("@crashed", $killed, 'the only process that crashed is the notifier killed with kill -9');
$node->stop;

# --- without preload ------------------------------------------------------------
my $plain = PostgreSQL::Test::Cluster->new('notify_no_preload');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $pl = listener($plain);
my $writer = $plain->background_psql('postgres');
my $writer_pid = $writer->query_safe('SELECT pg_backend_pid()');
$writer->query_safe('BEGIN');
$writer->query_safe(enqueue_sql('np-rolled-back'));
$writer->query_safe('ROLLBACK');
$writer->query_safe(enqueue_sql('np-1'));
is(hear($pl, 'np-1'), $writer_pid, 'without preload: announced by the committing session');
ok(!exists $pl->{heard}{'np-rolled-back'}, 'without preload: a rolled-back enqueue is not announced');
$writer->quit;
$pl->{session}->quit;
$plain->stop;

done_testing();
