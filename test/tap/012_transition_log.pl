# idempotency.log_transitions: with it on, every transition of a key is one
# LOG line of key=value fields (scope, key, from, to, token, attempt, and a
# reason for expiries, failures, releases, retention and claims that resume
# after finished steps), and every finished step of multi-step work a line
# of its own; with it off, none. Only a superuser may SET it.
#
# Every call below runs in a session of its own that sets the parameter
# first; the server log written since the previous check is then parsed and
# compared, line for line, with the transitions the calls made.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = PostgreSQL::Test::Cluster->new('transition_log');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\nidempotency.worker_enabled = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $log_on = 'SET idempotency.log_transitions = on;';

# Runs SQL (in one session, with log_transitions on unless told otherwise)
# and returns its output.
sub run
{
	my ($sql, $prefix) = @_;
	$prefix //= $log_on;
	return $node->safe_psql('postgres', "$prefix\n$sql");
}

my $offset = -s $node->logfile;

# The transition lines logged since the previous call, parsed.
sub logged
{
	my $log = slurp_file($node->logfile, $offset);
	$offset += length($log);
	my @lines;
	for my $line (split /\n/, $log)
	{
		next unless $line =~ /idempotency transition:(.*)$/;
		my $fields = $1;
		like($line, qr/ LOG:  idempotency transition: scope=/, "a LOG line: $fields");
		my (%f, @names);
		while ($fields =~ /\G (\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)/gc)
		{
			my ($name, $value) = ($1, $2);
			if ($value =~ /^"(.*)"$/)
			{
				$value = $1;
				$value =~ s/\\(.)/$1/g;
			}
			$f{$name} = $value;
			push @names, $name;
		}
		is(pos($fields) // 0, length($fields), "the whole line is key=value fields: $fields");
		my @expected_names = qw(scope key from to token attempt);
		push @expected_names, 'reason' if exists $f{reason};
		is_deeply(\@names, \@expected_names, "fields in order: @expected_names");
		push @lines, \%f;
	}
	return \@lines;
}

# A transition as logged.
sub tx
{
	my ($key, $from, $to, $token, $attempt, $reason, $scope) = @_;
	my %t = (
		scope => $scope // 'tlog',
		key => $key,
		from => $from,
		to => $to,
		token => $token,
		attempt => $attempt);
	$t{reason} = $reason if defined $reason;
	return \%t;
}

sub claim
{
	my ($key, $extra) = @_;
	$extra = defined $extra ? ", $extra" : '';
	return run("SELECT token FROM idempotency.idem_claim('$key', scope => 'tlog'$extra)");
}

# --- register, claim, complete ----------------------------------------------
run("SELECT idempotency.idem_register('reg', scope => 'tlog')");
my $t_reg = claim('reg');
run("SELECT idempotency.idem_complete('reg', $t_reg, '1', 'tlog')");
# A repeated complete and a duplicate claim change nothing: no line.
run("SELECT idempotency.idem_complete('reg', $t_reg, '1', 'tlog')");
claim('reg');
is_deeply(
	logged(),
	[
		tx('reg', 'none', 'RECEIVED', 'none', 0),
		tx('reg', 'RECEIVED', 'PROCESSING', $t_reg, 1),
		tx('reg', 'PROCESSING', 'COMPLETED', $t_reg, 1),
	],
	'register, claim, complete: one line each');

# --- fail: retryable, then final; attempts exhausted ----------------------------
my $t_f1 = claim('fail');
run("SELECT idempotency.idem_fail('fail', $t_f1, 'boom', retry_in => '0', scope => 'tlog')");
my $t_f2 = claim('fail');
run("SELECT idempotency.idem_fail('fail', $t_f2, 'fatal', false, scope => 'tlog')");
# The attempt cap is the one of the session that claimed the key.
my $t_ex = run("SET idempotency.max_attempts = 1; SELECT token FROM idempotency.idem_claim('exhausted', scope => 'tlog')");
run("SELECT idempotency.idem_fail('exhausted', $t_ex, 'boom', scope => 'tlog')");
is_deeply(
	logged(),
	[
		tx('fail', 'none', 'PROCESSING', $t_f1, 1),
		tx('fail', 'PROCESSING', 'FAILED_RETRYABLE', $t_f1, 1, 'retryable'),
		tx('fail', 'FAILED_RETRYABLE', 'PROCESSING', $t_f2, 2),
		tx('fail', 'PROCESSING', 'FAILED_FINAL', $t_f2, 2, 'not retryable'),
		tx('exhausted', 'none', 'PROCESSING', $t_ex, 1),
		tx('exhausted', 'PROCESSING', 'FAILED_FINAL', $t_ex, 1, 'attempts exhausted'),
	],
	'fail: retryable, retry, final, attempts exhausted');

# --- maintenance expiry, then a late heartbeat ------------------------------------
my $t_hb = claim('hb', "lease => '100ms'");
# A heartbeat of a live lease is no transition.
run("SELECT idempotency.idem_heartbeat('hb', $t_hb, '100ms', 'tlog')");
usleep(300_000);
is(run("SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_leases'"),
	'1', 'idem_maintenance() expires the lease');
# Once the expiry is recorded, a late heartbeat is refused and changes nothing.
my ($hb_rc, $hb_out, $hb_err) = $node->psql('postgres',
	"$log_on\n\\set VERBOSITY verbose\nSELECT idempotency.idem_heartbeat('hb', $t_hb, '1h', 'tlog')");
like($hb_err, qr/ERROR:  IK003/, 'a late heartbeat after the expiry raises IK003');
is_deeply(
	logged(),
	[
		tx('hb', 'none', 'PROCESSING', $t_hb, 1),
		tx('hb', 'PROCESSING', 'FAILED_RETRYABLE', $t_hb, 1, 'lease expired'),
	],
	'maintenance expiry; the refused late heartbeat logs nothing');

# --- release -------------------------------------------------------------------
my $t_rel = claim('rel');
run("SELECT idempotency.idem_release('rel', $t_rel, 'tlog')");
run("SELECT idempotency.idem_register('rel2', scope => 'tlog')");
my $t_rel2 = claim('rel2');
run("SELECT idempotency.idem_release('rel2', $t_rel2, 'tlog')");
is_deeply(
	logged(),
	[
		tx('rel', 'none', 'PROCESSING', $t_rel, 1),
		tx('rel', 'PROCESSING', 'deleted', $t_rel, 0, 'released'),
		tx('rel2', 'none', 'RECEIVED', 'none', 0),
		tx('rel2', 'RECEIVED', 'PROCESSING', $t_rel2, 1),
		tx('rel2', 'PROCESSING', 'RECEIVED', $t_rel2, 0, 'released'),
	],
	'release: a claimed key is deleted, a registered one goes back to RECEIVED');

# --- takeover; expiry to FAILED_FINAL by a claim ----------------------------------
my $t_take1 = claim('take', "lease => '100ms'");
usleep(300_000);
my $t_take2 = claim('take', "lease => '1h'");
# The attempt cap is the one of the session that claimed the key.
my $t_xf = run("SET idempotency.max_attempts = 1; "
	  . "SELECT token FROM idempotency.idem_claim('xfinal', scope => 'tlog', lease => '100ms')");
usleep(300_000);
is(run("SELECT outcome FROM idempotency.idem_claim('xfinal', scope => 'tlog')"),
	'failed', 'a claim of an expired lease whose attempts are exhausted answers failed');
is_deeply(
	logged(),
	[
		tx('take', 'none', 'PROCESSING', $t_take1, 1),
		tx('take', 'PROCESSING', 'PROCESSING', $t_take2, 2, 'lease expired'),
		tx('xfinal', 'none', 'PROCESSING', $t_xf, 1),
		tx('xfinal', 'PROCESSING', 'FAILED_FINAL', $t_xf, 1, 'lease expired, attempts exhausted'),
	],
	'takeover of an expired lease; expiry to FAILED_FINAL by a claim');

# --- a late complete after maintenance expiry; maintenance expiry to FAILED_FINAL --
my $t_late = claim('late', "lease => '100ms'");
usleep(300_000);
run('SELECT * FROM idempotency.idem_maintenance()');
run("SELECT idempotency.idem_complete('late', $t_late, scope => 'tlog')");
my $t_mf = run("SET idempotency.max_attempts = 1; "
	  . "SELECT token FROM idempotency.idem_claim('mfinal', scope => 'tlog', lease => '100ms')");
usleep(300_000);
run('SELECT * FROM idempotency.idem_maintenance()');
is_deeply(
	logged(),
	[
		tx('late', 'none', 'PROCESSING', $t_late, 1),
		tx('late', 'PROCESSING', 'FAILED_RETRYABLE', $t_late, 1, 'lease expired'),
		tx('late', 'FAILED_RETRYABLE', 'COMPLETED', $t_late, 1),
		tx('mfinal', 'none', 'PROCESSING', $t_mf, 1),
		tx('mfinal', 'PROCESSING', 'FAILED_FINAL', $t_mf, 1, 'lease expired'),
	],
	'late complete after maintenance expiry; maintenance expiry to FAILED_FINAL');

# --- multi-step work: a step is a line of its own; a claim that resumes says so --
# The step lines logged since the previous check, as they are (logged()
# then reads the transitions of the same stretch).
sub steps_logged
{
	my $log = slurp_file($node->logfile, $offset);
	return [ map { / LOG:  idempotency step: (.*)$/ ? ($1) : () } split /\n/, $log ];
}
my $t_st1 = claim('steps', "lease => '100ms'");
run("SELECT idempotency.idem_step('steps', $t_st1, 'reserve', scope => 'tlog')");
run("SELECT idempotency.idem_step('steps', $t_st1, 'charge', '\"ch_1\"', scope => 'tlog')");
# A refused step (a name already recorded) logs nothing.
$node->psql('postgres', "$log_on\nSELECT idempotency.idem_step('steps', $t_st1, 'charge', scope => 'tlog')");
usleep(300_000);
my $t_st2 = claim('steps');
run("SELECT idempotency.idem_step('steps', $t_st2, 'email', scope => 'tlog')");
run("SELECT idempotency.idem_fail('steps', $t_st2, 'boom', retry_in => '0', scope => 'tlog')");
my $t_st3 = claim('steps');
run("SELECT idempotency.idem_complete('steps', $t_st3, scope => 'tlog')");
is_deeply(
	steps_logged(),
	[
		"scope=tlog key=steps status=PROCESSING step=reserve n=1 token=$t_st1 attempt=1",
		"scope=tlog key=steps status=PROCESSING step=charge n=2 token=$t_st1 attempt=1",
		"scope=tlog key=steps status=PROCESSING step=email n=3 token=$t_st2 attempt=2",
	],
	'each recorded step is one line');
is_deeply(
	logged(),
	[
		tx('steps', 'none', 'PROCESSING', $t_st1, 1),
		tx('steps', 'PROCESSING', 'PROCESSING', $t_st2, 2, 'lease expired, resumed after 2 finished steps'),
		tx('steps', 'PROCESSING', 'FAILED_RETRYABLE', $t_st2, 2, 'retryable'),
		tx('steps', 'FAILED_RETRYABLE', 'PROCESSING', $t_st3, 3, 'resumed after 3 finished steps'),
		tx('steps', 'PROCESSING', 'COMPLETED', $t_st3, 3),
	],
	'a takeover and a retry that resume after finished steps say so');

# --- idempotency.expire_on_disconnect: the holder's backend has exited ------------
$node->safe_psql('postgres',
	'ALTER SYSTEM SET idempotency.expire_on_disconnect = on; SELECT pg_reload_conf()');
my ($t_dc, $pid_dc) = split /\|/,
  run("SELECT token, pg_backend_pid() FROM idempotency.idem_claim('gone', scope => 'tlog', lease => '1h')");
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid_dc"),
	'the holder has disconnected');
# 'take' (claimed above, lease 1h) was claimed by a session that has exited too.
is(run("SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'expire_disconnected'"),
	'2', 'idem_maintenance() expires the claims of the disconnected holders');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET idempotency.expire_on_disconnect; SELECT pg_reload_conf()');
my $disconnected = logged();
@$disconnected[1 .. $#$disconnected] =
  sort { $a->{key} cmp $b->{key} } @$disconnected[1 .. $#$disconnected];
is_deeply(
	$disconnected,
	[
		tx('gone', 'none', 'PROCESSING', $t_dc, 1),
		tx('gone', 'PROCESSING', 'FAILED_RETRYABLE', $t_dc, 1, 'holder disconnected'),
		tx('take', 'PROCESSING', 'FAILED_RETRYABLE', $t_take2, 2, 'holder disconnected'),
	],
	'expiry of disconnected holders');

# --- retention: finished keys deleted by maintenance ------------------------------
my $t_pc = claim('purge-c');
run("SELECT idempotency.idem_complete('purge-c', $t_pc, scope => 'tlog', retain => '0')");
# The retention is the one of the session that claimed the key.
my $t_pf = run("SET idempotency.retention = 0; SELECT token FROM idempotency.idem_claim('purge-f', scope => 'tlog')");
run("SELECT idempotency.idem_fail('purge-f', $t_pf, 'fatal', false, scope => 'tlog')");
is(run("SELECT rows FROM idempotency.idem_maintenance() WHERE task = 'purge_keys'"),
	'2', 'idem_maintenance() purges both keys');
# The sweep deletes in no particular order: its two lines are sorted by key.
my $purged = logged();
@$purged[4 .. $#$purged] = sort { $a->{key} cmp $b->{key} } @$purged[4 .. $#$purged];
is_deeply(
	$purged,
	[
		tx('purge-c', 'none', 'PROCESSING', $t_pc, 1),
		tx('purge-c', 'PROCESSING', 'COMPLETED', $t_pc, 1),
		tx('purge-f', 'none', 'PROCESSING', $t_pf, 1),
		tx('purge-f', 'PROCESSING', 'FAILED_FINAL', $t_pf, 1, 'not retryable'),
		tx('purge-c', 'COMPLETED', 'deleted', $t_pc, 1, 'retention'),
		tx('purge-f', 'FAILED_FINAL', 'deleted', $t_pf, 1, 'retention'),
	],
	'retention: COMPLETED and FAILED_FINAL keys deleted');

# --- values that need quoting stay machine-readable ---------------------------------
my $odd = 'odd "key" = x\\y';
(my $odd_sql = $odd) =~ s/'/''/g;
my $t_odd = run("SELECT token FROM idempotency.idem_claim('$odd_sql')");
is_deeply(logged(), [ tx($odd, 'none', 'PROCESSING', $t_odd, 1, undef, 'default') ],
	'a key with spaces, quotes, = and \\ is quoted and escaped');

# --- off: no line -----------------------------------------------------------------
my $off = 'SET idempotency.log_transitions = off;';
run("SELECT idempotency.idem_register('off-1', scope => 'tlog')", $off);
my $t_o1 = run("SELECT token FROM idempotency.idem_claim('off-1', scope => 'tlog')", $off);
run("SELECT idempotency.idem_complete('off-1', $t_o1, scope => 'tlog', retain => '0')", $off);
my $t_o2 = run("SELECT token FROM idempotency.idem_claim('off-2', scope => 'tlog', lease => '100ms')", $off);
my $t_o3 = run("SELECT token FROM idempotency.idem_claim('off-3', scope => 'tlog', lease => '100ms')", $off);
usleep(300_000);
run("SELECT idempotency.idem_claim('off-2', scope => 'tlog')", $off);
run('SELECT * FROM idempotency.idem_maintenance()', $off);
my $t_o3b = run("SELECT token FROM idempotency.idem_claim('off-3', scope => 'tlog')", $off);
run("SELECT idempotency.idem_heartbeat('off-3', $t_o3b, '1h', 'tlog')", $off);
run("SELECT idempotency.idem_fail('off-3', $t_o3b, 'x', false, scope => 'tlog')", $off);
my $t_o4 = run("SELECT token FROM idempotency.idem_claim('off-4', scope => 'tlog')", '');
run("SELECT idempotency.idem_release('off-4', $t_o4, 'tlog')", '');
is(run("SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'off-%'", ''),
	'2', 'the calls with log_transitions off were made');
my $log = slurp_file($node->logfile, $offset);
$offset += length($log);
unlike($log, qr/idempotency transition/, 'with log_transitions off (the default) no line is logged');

# --- only a superuser may set it ---------------------------------------------------
$node->safe_psql('postgres', q{
	CREATE ROLE regress_plain LOGIN;
	SELECT idempotency.grant_application('regress_plain');
});
for my $sql ('SET idempotency.log_transitions = on',
	'SET LOCAL idempotency.log_transitions = on',
	"SELECT set_config('idempotency.log_transitions', 'on', false)")
{
	my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql",
		extra_params => [ '-U', 'regress_plain' ]);
	isnt($rc, 0, "a plain role cannot: $sql");
	like($err, qr/ERROR:  42501: permission denied to set parameter "idempotency.log_transitions"/,
		"... 42501 permission denied");
}
is($node->safe_psql('postgres', 'SHOW idempotency.log_transitions', extra_params => [ '-U', 'regress_plain' ]),
	'off', 'a plain role sees it off');
my ($rc, $out, $err) = $node->psql('postgres',
	"SET idempotency.log_transitions = on;\nSELECT token FROM idempotency.idem_claim('plain-1', scope => 'tlog');",
	extra_params => [ '-U', 'regress_plain' ], on_error_stop => 0);
like($out, qr/^\d+$/, 'the plain role claims after its SET failed');
is_deeply(logged(), [], 'and logs nothing');
is( $node->safe_psql('postgres',
		"SET idempotency.log_transitions = on; SHOW idempotency.log_transitions"),
	'on', 'a superuser may set it');

ok(!$node->log_contains('terminated by signal'), 'no backend crashed');
$node->stop;
done_testing();
