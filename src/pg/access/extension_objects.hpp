// The extension's own objects in the current database, found by OID among
// the members of the extension (pg_depend) and kept until the catalog says
// they may have changed. SQL that names a table is written from these OIDs
// (pg/access/spi.hpp), and every statement the module plans is checked to touch
// only these tables (pg/access/statement_guard.hpp), so an object that a role
// creates under a look-alike name is never used, in backends or workers.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct ExtensionObjects {
    Oid extension;
    Oid schema;
    Oid owner;  // the extension's owner
    bool schema_is_owners;  // the schema belongs to the extension's owner or a superuser
    // Tables; InvalidOid when the installed version has none.
    Oid keys;
    Oid inbox;
    Oid locks;
    Oid outbox;
    Oid relay_grants;
    Oid token_seq;
    Oid tombstones;  // key_tombstones (0.7.0)
    Oid status_type;        // idem_status
    Oid outbox_state_type;  // outbox_state
    // Changes each time the objects are looked up afresh: plans made from an
    // older generation are made again.
    std::uint64_t generation;
    // Changes with the generation and after every invalidation of one of the
    // tables or of a watched relation (watch_relation): what the direct table
    // access caches (index OIDs, column numbers) is found again when it does.
    // A REINDEX CONCURRENTLY, a DROP and CREATE INDEX, a VACUUM FULL or an
    // ALTER TABLE invalidates the table, and so changes it.
    std::uint64_t layout;
};

// The objects of this database. Raises (a PostgreSQL error) 55000 when the
// extension is not installed, and 42501 when its schema belongs to another
// role than the extension's owner (that role could replace what the schema
// holds). Needs a transaction.
const ExtensionObjects& extension_objects();

// The same, or nullptr when the extension is not installed here.
const ExtensionObjects* installed_extension_objects();

// The objects without the check of the schema's owner (nullptr when the
// extension is not installed), and that check.
const ExtensionObjects* find_extension_objects();
bool schema_is_trusted(const ExtensionObjects& objects);

// "schema"."table" of one of the extension's tables, quoted as needed.
const char* qualified_table_name(Oid relation);

// Watches `relation` (an index a cache of the direct table access found by
// name): an invalidation of it changes ExtensionObjects::layout too, as one
// of the tables' does. Kept until the layout changes.
void watch_relation(Oid relation);

// Whether `relation` is one of the extension's tables.
bool is_extension_table(Oid relation);

}  // namespace idem::pg
