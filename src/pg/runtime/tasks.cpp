#include "pg/runtime/tasks.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/settings.hpp"

extern "C" {
#include "catalog/pg_class.h"
}

namespace idem::pg {

namespace {

// Every sweep statement (each beside the table's other statements: keys,
// outbox, inbox, locks) orders the rows it picks by the column of the
// partial index that finds them: the planner then walks that index whatever
// the statistics say (a sequential scan would have to sort the whole table
// first), so a sweep reads only the rows due, even right after a mass purge
// left statistics that call every row due. The sweeps also run with the
// scans that read a whole table or index turned off (kFullScans), which
// leaves the planner plain index scans for the statements no order fits.

// When the sweep has something to do next: the earliest lease end (keys and
// events in flight), and the earliest time a row passes its retention
// ($1 = outbox_retention, $2 = inbox_retention). Each minimum is read from
// the head of an index. Before 0.3.0 a finished key keeps its lease_until
// for good (nothing settles it) and the leases index holds PROCESSING keys.
// From 0.6.0 the live keys' index is read instead: the earliest lease of a
// PROCESSING key, and now when a key there waits to be settled.
Statement kNextDue = {
    "SELECT "
    "@if keys.active_since@(SELECT min(CASE status WHEN 'PROCESSING' THEN lease_until "
    "  WHEN 'RECEIVED' THEN NULL ELSE pg_catalog.now() END) FROM @keys@ "
    "  WHERE active_since IS NOT NULL)"
    "@else@(SELECT min(lease_until) FROM @keys@ WHERE "
    "@if keys.purge_at@lease_until IS NOT NULL@else@status = 'PROCESSING'@end@)@end@, "
    "@if outbox.lease_until@(SELECT min(lease_until) FROM @outbox@ WHERE state = 'in_flight')"
    "@else@NULL::pg_catalog.timestamptz@end@, "
    "(SELECT min(@if keys.purge_at@purge_at@else@expires_at@end@) FROM @keys@ "
    "  WHERE @if keys.purge_at@purge_at@else@expires_at@end@ IS NOT NULL), "
    "@if outbox.delivered_at@(SELECT min(delivered_at) + $1 FROM @outbox@ WHERE state = 'delivered')"
    "@else@NULL::pg_catalog.timestamptz@end@, "
    "(SELECT min(received_at) + $2 FROM @inbox@), "
    "(SELECT min(expires_at) FROM @locks@)",
    2, {INTERVALOID, INTERVALOID}, nullptr};

Statement kAnalyzeKeys = {"ANALYZE @keys@", 0, {}, nullptr};
Statement kAnalyzeOutbox = {"ANALYZE @outbox@", 0, {}, nullptr};
Statement kAnalyzeInbox = {"ANALYZE @inbox@", 0, {}, nullptr};
Statement kAnalyzeLocks = {"ANALYZE @locks@", 0, {}, nullptr};
Statement kAnalyzeTombstones = {"ANALYZE @tombstones@", 0, {}, nullptr};

Micros earliest(std::initializer_list<std::optional<Micros>> times) {
    Micros first = kNever;
    for (const auto& time : times)
        if (time) first = std::min(first, *time);
    return first;
}

// The table a task works on and the ANALYZE of it; no table when the
// installed version has none.
struct TaskTable {
    Oid table;
    Statement* analyze;
};

TaskTable table_of(const MaintenanceTask& task) {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr) return {InvalidOid, nullptr};
    if (std::strcmp(task.table, "idempotency_keys") == 0) return {objects->keys, &kAnalyzeKeys};
    if (std::strcmp(task.table, "outbox") == 0) return {objects->outbox, &kAnalyzeOutbox};
    if (std::strcmp(task.table, "inbox") == 0) return {objects->inbox, &kAnalyzeInbox};
    if (std::strcmp(task.table, "locks") == 0) return {objects->locks, &kAnalyzeLocks};
    if (std::strcmp(task.table, "key_tombstones") == 0)
        return {objects->tombstones, &kAnalyzeTombstones};
    return {InvalidOid, nullptr};
}

// The extension's table of that name (InvalidOid: the installed version
// has none).
Oid table_named(const ExtensionObjects* objects, const char* name) {
    const char* names[] = {"idempotency_keys", "outbox", "inbox", "locks", "key_tombstones"};
    const Oid tables[] = {objects->keys, objects->outbox, objects->inbox, objects->locks,
                          objects->tombstones};
    for (int i = 0; i < 5; ++i)
        if (std::strcmp(name, names[i]) == 0) return tables[i];
    return InvalidOid;
}

// Takes `mode` on each valid table of `tables` without waiting; false at
// the first one held (those taken stay taken until the transaction ends).
bool lock_now(std::initializer_list<Oid> tables, LOCKMODE mode) {
    for (const Oid table : tables)
        if (OidIsValid(table) && !ConditionalLockRelationOid(table, mode)) return false;
    return true;
}

}  // namespace

Oid task_table(const MaintenanceTask& task) {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr) return InvalidOid;
    const Oid table = table_named(objects, task.table);
    const bool has_column =
        task.column == nullptr || get_attnum(table, task.column) != InvalidAttrNumber;
    return OidIsValid(table) && has_column ? table : InvalidOid;
}

bool lock_task_tables_now(const MaintenanceTask& task) {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr) return false;
    const Oid also = task.also_writes != nullptr ? table_named(objects, task.also_writes) : InvalidOid;
    return lock_now({table_named(objects, task.table), also}, RowExclusiveLock);
}

bool task_applies(const MaintenanceTask& task) { return OidIsValid(task_table(task)); }

bool lock_extension_tables_now(LOCKMODE mode) {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr) return false;
    return lock_now({objects->keys, objects->outbox, objects->inbox, objects->locks,
                     objects->tombstones},
                    mode);
}

bool read_next_due(Micros* lease, Micros* retention) {
    if (!lock_extension_tables_now(AccessShareLock)) return false;
    Params params;
    params.add_interval(settings::seconds(settings::outbox_retention_s));
    params.add_interval(settings::seconds(settings::inbox_retention_s));
    execute(kNextDue, params);
    *lease = earliest({column_timestamp(1), column_timestamp(2)});
    *retention = earliest({column_timestamp(3), column_timestamp(4), column_timestamp(5),
                           column_timestamp(6)});
    return true;
}

bool analyze_after_purge(const MaintenanceTask& task, std::uint64_t purged) {
    const TaskTable of = table_of(task);
    if (!OidIsValid(of.table) || purged == 0) return false;
    // What the statistics last counted, before this purge.
    HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(of.table));
    if (!HeapTupleIsValid(tuple)) return false;
    const double counted = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->reltuples;
    ReleaseSysCache(tuple);
    if (static_cast<double>(purged) < kAnalyzeShare * counted) return false;
    execute(*of.analyze, Params{});
    return true;
}

const MaintenanceTask* maintenance_tasks(int* count) {
    *count = kBackgroundWork.task_count;
    return kBackgroundWork.tasks;
}

}  // namespace idem::pg
