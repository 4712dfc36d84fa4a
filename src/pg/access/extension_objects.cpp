#include "pg/access/extension_objects.hpp"

#include <cstring>

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

ExtensionObjects cached{};
bool cached_valid = false;
std::uint64_t last_generation = 0;
bool callbacks_installed = false;
// The layout the cached objects had when last looked up, and whether an
// invalidation ended it since.
std::uint64_t last_layout = 0;
bool layout_ended = true;
// Relations watched for the current layout (see watch_relation).
constexpr int kWatched = 16;
Oid watched[kWatched];
int watched_count = 0;

bool is_watched(Oid relation) {
    for (int i = 0; i < watched_count; ++i)
        if (watched[i] == relation) return true;
    return false;
}

bool is_cached_table(Oid relation) {
    return relation == cached.keys || relation == cached.inbox || relation == cached.locks ||
           relation == cached.outbox || relation == cached.relay_grants ||
           relation == cached.token_seq || relation == cached.tombstones;
}

// A change of one of the tables (ALTER, DROP, a rename) or of any schema
// (a rename) may change the objects or their names.
// Any of them, or a watched index, may have changed what the direct access
// cached about it (an index replaced by REINDEX CONCURRENTLY, new columns).
void forget_on_relation(Datum, Oid relation) {
    if (relation == InvalidOid || is_cached_table(relation) || is_watched(relation)) {
        cached_valid = false;
        layout_ended = true;
    }
}

void forget_all(Datum, int, uint32) {
    cached_valid = false;
    layout_ended = true;
}

void install_callbacks() {
    if (callbacks_installed) return;
    CacheRegisterRelcacheCallback(forget_on_relation, 0);
    CacheRegisterSyscacheCallback(NAMESPACEOID, forget_all, 0);
    callbacks_installed = true;
}

// The extension's schema and owner, from its pg_extension row.
void read_extension_row(ExtensionObjects* out) {
    Relation catalog = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(out->extension));
    SysScanDesc scan = systable_beginscan(catalog, ExtensionOidIndexId, true, nullptr, 1, &key);
    const HeapTuple tuple = systable_getnext(scan);
    if (HeapTupleIsValid(tuple)) {
        const auto* row = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple));
        out->schema = row->extnamespace;
        out->owner = row->extowner;
    }
    systable_endscan(scan);
    table_close(catalog, AccessShareLock);
}

int column_count(Oid relation) {
    const HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relation));
    if (!HeapTupleIsValid(tuple)) return 0;
    const int count = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relnatts;
    ReleaseSysCache(tuple);
    return count;
}

Oid schema_owner(Oid schema) {
    const HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
    if (!HeapTupleIsValid(tuple)) return InvalidOid;
    const Oid owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner;
    ReleaseSysCache(tuple);
    return owner;
}

// A member relation of the extension's schema, filed by its name.
void file_relation(Oid relation, Oid schema, ExtensionObjects* out) {
    if (get_rel_namespace(relation) != schema) return;
    const char* name = get_rel_name(relation);
    if (name == nullptr) return;
    const char relkind = get_rel_relkind(relation);
    struct Named {
        const char* name;
        char relkind;
        Oid* slot;
    };
    const Named tables[] = {
        {"idempotency_keys", RELKIND_RELATION, &out->keys},
        {"inbox", RELKIND_RELATION, &out->inbox},
        {"locks", RELKIND_RELATION, &out->locks},
        {"outbox", RELKIND_RELATION, &out->outbox},
        {"relay_grants", RELKIND_RELATION, &out->relay_grants},
        {"token_seq", RELKIND_SEQUENCE, &out->token_seq},
        {"key_tombstones", RELKIND_RELATION, &out->tombstones},
    };
    for (const Named& table : tables)
        if (relkind == table.relkind && std::strcmp(name, table.name) == 0) *table.slot = relation;
}

void file_type(Oid type, Oid schema, ExtensionObjects* out) {
    const HeapTuple tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
    if (!HeapTupleIsValid(tuple)) return;
    const auto* form = reinterpret_cast<Form_pg_type>(GETSTRUCT(tuple));
    if (form->typnamespace == schema && form->typtype == TYPTYPE_ENUM) {
        if (std::strcmp(NameStr(form->typname), "idem_status") == 0) out->status_type = type;
        if (std::strcmp(NameStr(form->typname), "outbox_state") == 0) out->outbox_state_type = type;
    }
    ReleaseSysCache(tuple);
}

// Every member of the extension (pg_depend rows with deptype 'e').
void collect_members(ExtensionObjects* out) {
    Relation depend = table_open(DependRelationId, AccessShareLock);
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(ExtensionRelationId));
    ScanKeyInit(&keys[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(out->extension));
    SysScanDesc scan = systable_beginscan(depend, DependReferenceIndexId, true, nullptr, 2, keys);
    HeapTuple tuple;
    while (HeapTupleIsValid(tuple = systable_getnext(scan))) {
        const auto* row = reinterpret_cast<Form_pg_depend>(GETSTRUCT(tuple));
        if (row->deptype != DEPENDENCY_EXTENSION) continue;
        if (row->classid == RelationRelationId) file_relation(row->objid, out->schema, out);
        if (row->classid == TypeRelationId) file_type(row->objid, out->schema, out);
    }
    systable_endscan(scan);
    table_close(depend, AccessShareLock);
}

// What a plan made from the objects depends on: their OIDs and the names
// its SQL text was written with.
constexpr int kNameBytes = 2 * NAMEDATALEN + 16;
constexpr int kNamedTables = 7;
char cached_names[kNamedTables][kNameBytes];

bool same_objects(const ExtensionObjects& found, char names[kNamedTables][kNameBytes]) {
    const Oid tables[kNamedTables] = {found.keys,         found.inbox,     found.locks,
                                      found.outbox,       found.relay_grants, found.token_seq,
                                      found.tombstones};
    bool same = cached.extension == found.extension && cached.schema == found.schema &&
                cached.owner == found.owner && cached.status_type == found.status_type &&
                cached.outbox_state_type == found.outbox_state_type;
    // A statement is written for the table's name and its columns.
    for (int i = 0; i < kNamedTables; ++i) {
        names[i][0] = '\0';
        if (OidIsValid(tables[i]))
            snprintf(names[i], kNameBytes, "%s/%d", qualified_table_name(tables[i]),
                     column_count(tables[i]));
        same = same && std::strcmp(names[i], cached_names[i]) == 0;
    }
    return same && cached.keys == found.keys &&
           cached.inbox == found.inbox && cached.locks == found.locks &&
           cached.outbox == found.outbox && cached.relay_grants == found.relay_grants &&
           cached.token_seq == found.token_seq && cached.tombstones == found.tombstones;
}

// Looks the objects up afresh; false when the extension is not installed.
// The generation changes only when something a plan depends on changed
// (not, say, when a vacuum of a table sent an invalidation).
bool look_up() {
    install_callbacks();
    ExtensionObjects found{};
    found.extension = get_extension_oid("idempotency", true);
    if (!OidIsValid(found.extension)) return false;
    read_extension_row(&found);
    // The owner of the schema may create, rename and replace what it holds:
    // it must be the extension's owner, or a superuser (who may anyway).
    // A change of the schema's owner invalidates the lookup (NAMESPACEOID).
    const Oid owner_of_schema = schema_owner(found.schema);
    found.schema_is_owners = owner_of_schema == found.owner || superuser_arg(owner_of_schema);
    collect_members(&found);
    char names[kNamedTables][kNameBytes];
    found.generation = same_objects(found, names) ? cached.generation : ++last_generation;
    if (layout_ended || found.generation != cached.generation) {
        found.layout = ++last_layout;
        watched_count = 0;
        layout_ended = false;
    } else {
        found.layout = cached.layout;
    }
    std::memcpy(cached_names, names, sizeof names);
    cached = found;
    cached_valid = true;
    return true;
}

[[noreturn]] void raise_foreign_schema(const ExtensionObjects& objects) {
    ereport(ERROR,
            (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
             errmsg("schema \"%s\" belongs to role %s, not to the extension's owner %s",
                    get_namespace_name(objects.schema),
                    GetUserNameFromId(schema_owner(objects.schema), true),
                    GetUserNameFromId(objects.owner, true)),
             errdetail("The owner of the schema could replace the extension's objects, so "
                       "the idempotency functions refuse to work in it."),
             errhint("Check what the schema holds, then ALTER SCHEMA %s OWNER TO %s.",
                     quote_identifier(get_namespace_name(objects.schema)),
                     quote_identifier(GetUserNameFromId(objects.owner, true)))));
    pg_unreachable();
}

}  // namespace

const ExtensionObjects* find_extension_objects() {
    if (!cached_valid && !look_up()) return nullptr;
    return &cached;
}

bool schema_is_trusted(const ExtensionObjects& objects) { return objects.schema_is_owners; }

const ExtensionObjects* installed_extension_objects() {
    const ExtensionObjects* objects = find_extension_objects();
    if (objects != nullptr && !schema_is_trusted(*objects)) raise_foreign_schema(*objects);
    return objects;
}

const ExtensionObjects& extension_objects() {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("extension \"idempotency\" is not installed in this database")));
    return *objects;
}

const char* qualified_table_name(Oid relation) {
    const char* name = get_rel_name(relation);
    const char* schema = get_namespace_name(get_rel_namespace(relation));
    if (name == nullptr || schema == nullptr)
        elog(ERROR, "idempotency: relation %u of the extension has disappeared", relation);
    return quote_qualified_identifier(schema, name);
}

void watch_relation(Oid relation) {
    if (is_watched(relation)) return;
    // Past the room for them, every invalidation ends the layout.
    if (watched_count == kWatched) {
        cached_valid = false;
        layout_ended = true;
        return;
    }
    watched[watched_count++] = relation;
}

bool is_extension_table(Oid relation) {
    if (!OidIsValid(relation)) return false;
    if (cached_valid && is_cached_table(relation)) return true;
    // A table added since the lookup (ALTER EXTENSION ... UPDATE) is found
    // by looking again.
    return look_up() && is_cached_table(relation);
}

}  // namespace idem::pg
