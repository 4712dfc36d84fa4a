# The full install script of the current version and the chain of update
# scripts build the same extension. In one cluster, database fresh gets
# CREATE EXTENSION idempotency (the current version's own script) and
# database updated gets version 0.1.0 and ALTER EXTENSION ... UPDATE; both
# are described from the catalog (every member of the extension and its
# parts, definitions, rights, comments, and the rows of its tables) and the
# descriptions must be equal.
#
# Column order is compared too (a column's position is part of its
# description): the full script puts the columns that later versions added
# last, where ALTER TABLE ... ADD COLUMN puts them, so that SELECT *,
# idem_get's result, COPY and a dump see one row layout whichever way the
# extension was installed. (The module finds its columns by name, not by
# number, so either layout would work for it; the users' queries are why.)
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdemTap;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('install_script', conf => ['idempotency.worker_enabled = off']);

# The extension as pairs [object, description], sorted. Names, not OIDs;
# lists of rights in a fixed order (the same rights granted in another
# order are the same rights).
my $describe = <<'SQL';
WITH RECURSIVE
ext AS (SELECT * FROM pg_extension WHERE extname = 'idempotency'),
members AS (
    SELECT d.classid, d.objid
      FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
-- The members and their parts, however deep: indexes, constraints, column
-- defaults, owned sequences, row and array types, rules, triggers.
objects (classid, objid) AS (
    SELECT classid, objid FROM members
    UNION
    SELECT d.classid, d.objid FROM pg_depend d JOIN objects o
        ON d.refclassid = o.classid AND d.refobjid = o.objid
     WHERE d.deptype IN ('a', 'i')),
-- Toast tables are named by OID: a relation says whether it has one.
rels AS (
    SELECT c.* FROM pg_class c JOIN objects o ON o.classid = 'pg_class'::regclass AND o.objid = c.oid
     WHERE c.relnamespace <> 'pg_toast'::regnamespace)
SELECT json_agg(json_build_array(object, description) ORDER BY object, description)
FROM (
SELECT 'extension',
       format('version=%s relocatable=%s schema=%s owner=%s dumped=%s', e.extversion, e.extrelocatable,
              e.extnamespace::regnamespace, e.extowner::regrole,
              (SELECT string_agg(c::regclass || ' ' || coalesce(f, ''), ', ' ORDER BY n)
                 FROM unnest(e.extconfig, e.extcondition) WITH ORDINALITY u(c, f, n)))
  FROM ext e
UNION ALL
SELECT 'member ' || pg_describe_object(classid, objid, 0), '' FROM members
UNION ALL
SELECT 'part ' || pg_describe_object(o.classid, o.objid, 0), ''
  FROM objects o
 WHERE NOT (o.classid = 'pg_class'::regclass
            AND (SELECT relnamespace FROM pg_class WHERE oid = o.objid) = 'pg_toast'::regnamespace)
   AND NOT (o.classid = 'pg_type'::regclass
            AND (SELECT typnamespace FROM pg_type WHERE oid = o.objid) = 'pg_toast'::regnamespace)
UNION ALL
SELECT 'schema ' || n.nspname,
       format('owner=%s acl=%s', n.nspowner::regrole,
              coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(n.nspacl) a), 'default'))
  FROM pg_namespace n, ext e WHERE n.oid = e.extnamespace
UNION ALL
SELECT 'relation ' || c.oid::regclass,
       format('kind=%s persistence=%s am=%s owner=%s options=%s toast=%s replident=%s rowsecurity=%s,%s acl=%s',
              c.relkind, c.relpersistence, coalesce(am.amname, '-'), c.relowner::regrole,
              coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM unnest(c.reloptions) o), ''),
              c.reltoastrelid <> 0, c.relreplident, c.relrowsecurity, c.relforcerowsecurity,
              coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(c.relacl) a), 'default'))
  FROM rels c LEFT JOIN pg_am am ON am.oid = c.relam
UNION ALL
-- Columns of tables, views, sequences and composite types, with their
-- position. Some server builds store an option pg_attver on every column
-- that says when the column was made, not what it is: it is left out.
SELECT 'column ' || a.attrelid::regclass || '.' || quote_ident(a.attname),
       format('position=%s type=%s notnull=%s default=%s identity=%s generated=%s collation=%s '
              'storage=%s compression=%s statistics=%s options=%s acl=%s',
              a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
              coalesce(pg_get_expr(ad.adbin, ad.adrelid), ''), a.attidentity, a.attgenerated,
              coalesce(co.collname, '-'), a.attstorage, a.attcompression, a.attstattarget,
              coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM unnest(a.attoptions) o
                         WHERE o NOT LIKE 'pg\_attver=%'), ''),
              coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(a.attacl) x), 'default'))
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation
 WHERE a.attnum > 0 AND NOT a.attisdropped
   AND (c.oid IN (SELECT oid FROM rels WHERE relkind <> 'i')
        OR c.reltype IN (SELECT objid FROM members WHERE classid = 'pg_type'::regclass))
UNION ALL
SELECT 'index ' || i.indexrelid::regclass,
       format('%s unique=%s primary=%s clustered=%s valid=%s replident=%s',
              pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary, i.indisclustered,
              i.indisvalid, i.indisreplident)
  FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'constraint ' || coalesce(con.conrelid::regclass::text, con.contypid::regtype::text) || ' ' || con.conname,
       format('%s deferrable=%s deferred=%s validated=%s index=%s', pg_get_constraintdef(con.oid),
              con.condeferrable, con.condeferred, con.convalidated, coalesce(con.conindid::regclass::text, '-'))
  FROM pg_constraint con
 WHERE con.conrelid IN (SELECT oid FROM rels)
    OR con.contypid IN (SELECT objid FROM members WHERE classid = 'pg_type'::regclass)
UNION ALL
SELECT 'trigger ' || t.tgrelid::regclass || ' ' || t.tgname,
       format('%s enabled=%s', pg_get_triggerdef(t.oid), t.tgenabled)
  FROM pg_trigger t WHERE t.tgrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'rule ' || r.ev_class::regclass || ' ' || r.rulename,
       format('%s enabled=%s', pg_get_ruledef(r.oid), r.ev_enabled)
  FROM pg_rewrite r WHERE r.ev_class IN (SELECT oid FROM rels) AND r.rulename <> '_RETURN'
UNION ALL
SELECT 'policy ' || p.polrelid::regclass || ' ' || p.polname,
       format('cmd=%s permissive=%s roles=%s using=%s check=%s', p.polcmd, p.polpermissive,
              p.polroles::regrole[], pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
  FROM pg_policy p WHERE p.polrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'view ' || c.oid::regclass, pg_get_viewdef(c.oid)
  FROM rels c WHERE c.relkind IN ('v', 'm')
UNION ALL
SELECT 'sequence ' || s.seqrelid::regclass,
       format('type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s last_value=%s',
              s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
              coalesce(pg_sequence_last_value(s.seqrelid)::text, 'none'))
  FROM pg_sequence s WHERE s.seqrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'function ' || p.oid::regprocedure,
       format(E'kind=%s owner=%s definer=%s volatility=%s parallel=%s strict=%s leakproof=%s '
              'cost=%s rows=%s config=%s acl=%s\n%s',
              p.prokind, p.proowner::regrole, p.prosecdef, p.provolatile, p.proparallel, p.proisstrict,
              p.proleakproof, p.procost, p.prorows, coalesce(p.proconfig::text, ''),
              coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(p.proacl) a), 'default'),
              CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END)
  FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT 'type ' || t.oid::regtype,
       format('kind=%s owner=%s acl=%s labels=%s', t.typtype, t.typowner::regrole,
              coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(t.typacl) a), 'default'),
              (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid))
  FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
UNION ALL
SELECT 'event trigger ' || t.evtname,
       format('event=%s function=%s enabled=%s tags=%s owner=%s', t.evtevent, t.evtfoid::regprocedure,
              t.evtenabled, t.evttags, t.evtowner::regrole)
  FROM pg_event_trigger t JOIN members m ON m.classid = 'pg_event_trigger'::regclass AND m.objid = t.oid
UNION ALL
-- The rights an extension's scripts gave: pg_dump writes only the changes
-- made to them since.
SELECT 'initial rights ' || pg_describe_object(ip.classoid, ip.objoid, ip.objsubid),
       coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(ip.initprivs) a), '')
  FROM pg_init_privs ip WHERE ip.privtype = 'e'
UNION ALL
SELECT 'comment ' || pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
  FROM pg_description d
 WHERE (d.classoid, d.objoid) IN (SELECT classid, objid FROM objects)
    OR (d.classoid, d.objoid) IN (SELECT 'pg_namespace'::regclass, extnamespace FROM ext)
) described (object, description)
SQL

# The rows of every table of the extension (the kinds of roles and their
# rights; the other tables are empty), sorted.
my $tables = q{
SELECT c.oid::regclass FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
 WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND c.relkind = 'r'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
 ORDER BY 1};

# describe(DB): object => description, rows of the tables included.
sub describe
{
	my ($db) = @_;
	my %described;
	foreach my $pair (@{ decode_json($node->safe_psql($db, $describe)) })
	{
		my ($object, $description) = @$pair;
		# An object twice (it should not be) is described twice, not lost.
		$described{$object} =
		  exists $described{$object} ? "$described{$object}\n$description" : $description;
	}
	foreach my $table (split /\n/, $node->safe_psql($db, $tables))
	{
		$described{"rows of $table"} = $node->safe_psql($db,
			"SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM $table t");
	}
	return \%described;
}

# differences(A, B, NAME_A, NAME_B): the objects described differently,
# each with both descriptions.
sub differences
{
	my ($a, $b, $name_a, $name_b) = @_;
	my %objects = map { $_ => 1 } keys %$a, keys %$b;
	my @differ;
	foreach my $object (sort keys %objects)
	{
		my ($in_a, $in_b) = ($a->{$object}, $b->{$object});
		next if defined $in_a && defined $in_b && $in_a eq $in_b;
		push @differ,
		  join("\n", "$object:",
			"  $name_a: " . ($in_a // '(none)'),
			"  $name_b: " . ($in_b // '(none)'));
	}
	return @differ;
}

my $default = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'");
my $sharedir = $node->config_data('--sharedir');
ok(-f "$sharedir/extension/idempotency--$default.sql",
	"version $default has a full install script of its own");

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('updated', "CREATE EXTENSION idempotency VERSION '0.1.0'");
$node->safe_psql('updated', 'ALTER EXTENSION idempotency UPDATE');
foreach my $db ('fresh', 'updated')
{
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
		$default, "$db: version $default");
}

my $fresh = describe('fresh');
my $updated = describe('updated');
# The description reaches what it must compare.
like($fresh->{'function idempotency.idem_claim(text,jsonb,interval,text,interval)'},
	qr/CREATE OR REPLACE FUNCTION idempotency\.idem_claim\(key text/, 'functions are described in full');
like($fresh->{'column idempotency.idempotency_keys.active_since'},
	qr/position=23 /, 'columns with their position');
like($fresh->{'rows of idempotency.role_kind_rights'}, qr/^\(admin,"request_sweep\(\)",f\)$/m,
	'the rows of the rights table');
like($fresh->{'initial rights function idempotency.key_counts()'}, qr/pg_monitor=X/,
	'the rights the scripts gave');

my @differ = differences($fresh, $updated, 'CREATE EXTENSION', "0.1.0 and ALTER EXTENSION UPDATE");
is(scalar(@differ), 0, "a fresh install of $default equals 0.1.0 updated to $default")
  or diag(join("\n", @differ));

# The comparison sees a change of each kind: a right, a comment, a
# function's setting, a column's default, a row of the rights table.
$node->safe_psql('postgres', 'CREATE ROLE someone');
$node->safe_psql('postgres', 'CREATE DATABASE changed TEMPLATE fresh');
$node->safe_psql(
	'changed', q{
GRANT EXECUTE ON FUNCTION idempotency.idem_get(text, text) TO someone;
COMMENT ON COLUMN idempotency.inbox.payload IS 'what the message carried';
ALTER FUNCTION idempotency.stuck_after() COST 2;
ALTER TABLE idempotency.outbox ALTER COLUMN attempts SET DEFAULT 1;
DELETE FROM idempotency.role_kind_rights WHERE object = 'request_sweep()';});
my @changed = map { (split /\n/)[0] } differences($fresh, describe('changed'), 'fresh', 'changed');
is_deeply(
	\@changed,
	[
		'column idempotency.outbox.attempts:',
		'comment column payload of table idempotency.inbox:',
		'function idempotency.idem_get(text,text):',
		'function idempotency.stuck_after():',
		'rows of idempotency.role_kind_rights:'
	],
	'each change is found, and nothing else') or diag(join("\n", @changed));

done_testing();
