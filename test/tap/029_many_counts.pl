# The counts behind idem_stats and outbox_lag with more scopes and topics
# than the table of counts in shared memory holds (idempotency.max_gauges,
# over all databases): the database with the most names in the table when
# it is full counts its figures from its tables at each read instead
# (counted_by = 'scan', said once in the log); every other database keeps
# its counts, exact, in the table (counted_by = 'commits'), whether it was
# created before that database filled the table or after.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('many_counts', conf => [ 'idempotency.max_gauges = 4096' ]);

# $n topics with one pending event each and $n scopes with one completed
# key each, from $from on, through the extension's functions, $batch a
# transaction.
sub fill
{
	my ($db, $prefix, $from, $n, $batch) = @_;
	for (my $start = $from; $start < $from + $n; $start += $batch)
	{
		my $end = $start + $batch - 1;
		$end = $from + $n - 1 if $end > $from + $n - 1;
		$node->safe_psql($db, qq{
SET idempotency.outbox_notify = off;
SELECT count(idempotency.outbox_enqueue('$prefix-t' || g, '{}')) FROM generate_series($start, $end) g;
SELECT count(idempotency.idem_complete('k', (idempotency.idem_claim('k', scope => '$prefix-s' || g)).token,
                                       '{}', '$prefix-s' || g))
  FROM generate_series($start, $end) g;});
	}
}

# The views against the tables: "pending completed topics scopes mismatches counted_by".
sub counts
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
WITH lag AS (SELECT * FROM idempotency.outbox_lag),
     stats AS (SELECT * FROM idempotency.idem_stats),
     pending AS (SELECT topic, count(*) AS n FROM idempotency.outbox
                  WHERE state = 'pending' GROUP BY topic),
     completed AS (SELECT scope, count(*) AS n FROM idempotency.idempotency_keys
                    WHERE status = 'COMPLETED' GROUP BY scope)
SELECT (SELECT coalesce(sum(pending)::text, 'NULL') FROM lag) || ' '
    || (SELECT coalesce(sum(completed)::text, 'NULL') FROM stats) || ' '
    || (SELECT count(*) FROM lag WHERE pending > 0) || ' '
    || (SELECT count(*) FROM stats WHERE completed > 0) || ' '
    || (SELECT count(*) FROM lag l FULL JOIN pending p USING (topic)
         WHERE l.pending IS DISTINCT FROM coalesce(p.n, 0))
       + (SELECT count(*) FROM stats s FULL JOIN completed c USING (scope)
           WHERE s.completed IS DISTINCT FROM coalesce(c.n, 0)) || ' '
    || coalesce((SELECT string_agg(DISTINCT counted_by, ',') FROM lag), '-') || ','
    || coalesce((SELECT string_agg(DISTINCT counted_by, ',') FROM stats), '-')});
}

# What the tables hold: "pending completed topics scopes".
sub table_counts
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
SELECT (SELECT count(*) FROM idempotency.outbox WHERE state = 'pending') || ' '
    || (SELECT count(*) FROM idempotency.idempotency_keys WHERE status = 'COMPLETED') || ' '
    || (SELECT count(DISTINCT topic) FROM idempotency.outbox WHERE state = 'pending') || ' '
    || (SELECT count(DISTINCT scope) FROM idempotency.idempotency_keys WHERE status = 'COMPLETED')});
}

# A new install: its counts are known once recounted (at once by a read,
# or by the worker); from then on commits keep them.
sub install
{
	my ($db) = @_;
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	ok(poll_until(30, sub {
				$node->safe_psql($db,
					'SELECT counted_by FROM idempotency.key_counts() WHERE scope IS NULL') eq 'commits';
			}),
		"$db: counts known");
}

sub db_oid
{
	my ($db) = @_;
	return $node->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = '$db'");
}

my $overflow_line = sub {
	my ($db) = @_;
	my $oid = db_oid($db);
	return qr/counts of database $oid do not fit in idempotency\.max_gauges/;
};
my $lines_of = sub {
	my ($re) = @_;
	my @found = slurp_file($node->logfile) =~ /$re/g;
	return scalar @found;
};

# A database made before the fill, its counts kept.
$node->safe_psql('postgres', 'CREATE DATABASE before');
install('before');
fill('before', 'b', 1, 10, 10);
is(counts('before'), '10 10 10 10 0 commits,commits', 'before the fill: a small database keeps its counts');

# The fill: 20,000 topics and 20,000 scopes in one database.
install('postgres');
fill('postgres', 'p', 1, 20000, 5000);
is(table_counts('postgres'), '20000 20000 20000 20000', 'the tables hold 20,000 topics and scopes');
is(counts('postgres'), '20000 20000 20000 20000 0 scan,scan',
	'the views count them exactly, from the tables (counted_by scan)');
is($lines_of->($overflow_line->('postgres')), 1, 'the log says so, once');
like(slurp_file($node->logfile), qr/HINT:  Raise idempotency\.max_gauges/, '... with the setting to raise');

# More work there: still exact, no further log line.
fill('postgres', 'p', 20001, 100, 100);
$node->safe_psql('postgres', q{
SELECT idempotency.outbox_ack(ARRAY(SELECT id FROM idempotency.outbox_claim('r', 50, '1 hour', '{p-t1,p-t2,p-t3}')));});
is(counts('postgres'), table_counts('postgres') . ' 0 scan,scan', 'later commits: the views still exact');
is($lines_of->($overflow_line->('postgres')), 1, '... and the log line is not repeated');

# The database made before keeps its counts in the table, exact.
fill('before', 'b', 11, 20, 20);
is(counts('before'), '30 30 30 30 0 commits,commits', 'the database made before: exact, kept by commits');

# A database made after the fill.
$node->safe_psql('postgres', 'CREATE DATABASE after');
install('after');
fill('after', 'a', 1, 10, 10);
is(counts('after'), '10 10 10 10 0 commits,commits', 'a database made after the fill: exact, kept by commits');

# A table full of another database's names: the one with the most names
# leaves the table, the small one keeps its counts.
$node->safe_psql('postgres', 'CREATE DATABASE crowd');
install('crowd');
$node->safe_psql('crowd', 'SET idempotency.outbox_notify = off;
SELECT count(idempotency.outbox_enqueue(\'c-t\' || g, \'{}\')) FROM generate_series(1, 4000) g');
is(counts('crowd'), '4000 NULL 4000 0 0 commits,-', 'a database with 4,000 topics fits');
fill('before', 'b', 31, 100, 100);
is(counts('before'), '130 130 130 130 0 commits,commits',
	'when the table is full the small database keeps its counts');
is(counts('crowd'), '4000 NULL 4000 0 0 scan,-', '... and the largest counts from its tables');
is($lines_of->($overflow_line->('crowd')), 1, '... which the log says');

# After a restart every database is recounted: the large one overflows
# again (said again, once), the others keep their counts.
$node->restart;
ok(poll_until(60, sub { counts('postgres') eq table_counts('postgres') . ' 0 scan,scan' }),
	'after a restart the large database counts from its tables');
ok(poll_until(60, sub { counts('before') eq '130 130 130 130 0 commits,commits' }),
	'... and the small ones are recounted into the table');
ok(poll_until(60, sub { counts('after') eq '10 10 10 10 0 commits,commits' }), '... all of them');
ok(poll_until(60, sub { counts('crowd') eq '4000 NULL 4000 0 0 scan,-' }),
	'... but the one that fits only without the small ones');
ok(poll_until(60, sub { $lines_of->($overflow_line->('postgres')) == 2 }), 'the restart\'s overflow is logged once more');

$node->stop;
done_testing();
