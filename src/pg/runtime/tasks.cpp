#include "pg/runtime/tasks.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "core/error.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/status_enum.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/inbox/inbox.hpp"
#include "pg/keys/key_store.hpp"
#include "pg/locks/locks.hpp"
#include "pg/outbox/store.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/stats/gauges.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/stats/recount.hpp"

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

std::uint64_t expire_outbox_leases(int batch) {
    std::uint64_t dead = 0;
    const std::uint64_t expired =
        expire_event_leases(batch, settings::outbox_max_attempts, GetCurrentTimestamp(), &dead);
    count_on_commit(Counter::OutboxRetried, expired - dead);
    count_on_commit(Counter::OutboxDead, dead);
    return expired;
}

std::uint64_t purge_outbox(int batch) {
    return purge_delivered_events(
        batch, GetCurrentTimestamp() - settings::seconds(settings::outbox_retention_s));
}

constexpr MaintenanceTask kTasks[] = {
    {"expire_leases", "idempotency_keys", nullptr, TaskKind::Lease, expire_key_leases},
    {"expire_disconnected", "idempotency_keys", nullptr, TaskKind::Lease, expire_disconnected_keys},
    {"settle_leases", "idempotency_keys", "purge_at", TaskKind::Lease, settle_key_leases},
    {"expire_outbox_leases", "outbox", nullptr, TaskKind::Lease, expire_outbox_leases},
    {"purge_keys", "idempotency_keys", nullptr, TaskKind::Retention, purge_keys},
    {"purge_outbox", "outbox", nullptr, TaskKind::Retention, purge_outbox},
    {"purge_inbox", "inbox", nullptr, TaskKind::Retention, purge_inbox},
    {"purge_locks", "locks", nullptr, TaskKind::Retention, purge_locks},
};

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
    return {InvalidOid, nullptr};
}

// idem_maintenance(): every task until a batch comes back short.
Datum maintenance_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const int batch = settings::purge_batch;

    connect_spi();
    // As in the worker, the sweeps find rows through their indexes; the
    // caller's setting is back when the function returns.
    const int nest_level = NewGUCNestLevel();
    for (const char* scan : kFullScans)
        (void)set_config_option(scan, "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                                false);
    // What the workers would do first when the counts are unknown.
    (void)recount_if_unknown(true);
    for (const MaintenanceTask& task : kTasks) {
        if (!task_applies(task)) continue;
        std::uint64_t total = 0;
        for (;;) {
            const std::uint64_t changed = task.run_batch(batch);
            total += changed;
            if (changed < static_cast<std::uint64_t>(batch)) break;
            CHECK_FOR_INTERRUPTS();
        }
        Datum values[2] = {CStringGetTextDatum(task.name), Int64GetDatum(static_cast<int64>(total))};
        bool nulls[2] = {false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    AtEOXact_GUC(true, nest_level);
    finish_spi();
    return 0;
}

// idempotency.request_sweep(): a worker sweeps this database soon, whatever
// the due times say (after rows were written behind the functions' back).
Datum request_sweep_body(FunctionCallInfo) {
    (void)require_shared_state("idempotency.request_sweep()");
    // Rows written behind the functions are counted again, too.
    forget_gauges(MyDatabaseId);
    if (!request_sweep(MyDatabaseId))
        throw Error("53000",
                    "the launcher's table of databases is full (idempotency.max_databases)");
    PG_RETURN_VOID();
}

}  // namespace

Oid task_table(const MaintenanceTask& task) {
    const ExtensionObjects* objects = installed_extension_objects();
    if (objects == nullptr) return InvalidOid;
    const char* names[] = {"idempotency_keys", "outbox", "inbox", "locks"};
    const Oid tables[] = {objects->keys, objects->outbox, objects->inbox, objects->locks};
    for (int i = 0; i < 4; ++i) {
        if (std::strcmp(task.table, names[i]) != 0) continue;
        const bool has_column =
            task.column == nullptr || get_attnum(tables[i], task.column) != InvalidAttrNumber;
        return OidIsValid(tables[i]) && has_column ? tables[i] : InvalidOid;
    }
    return InvalidOid;
}

bool task_applies(const MaintenanceTask& task) { return OidIsValid(task_table(task)); }

void read_next_due(Micros* lease, Micros* retention) {
    Params params;
    params.add_interval(settings::seconds(settings::outbox_retention_s));
    params.add_interval(settings::seconds(settings::inbox_retention_s));
    execute(kNextDue, params);
    *lease = earliest({column_timestamp(1), column_timestamp(2)});
    *retention = earliest({column_timestamp(3), column_timestamp(4), column_timestamp(5),
                           column_timestamp(6)});
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
    *count = static_cast<int>(sizeof kTasks / sizeof kTasks[0]);
    return kTasks;
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_maintenance, idem::pg::maintenance_body)
IDEM_SQL_FUNCTION(idem_request_sweep, idem::pg::request_sweep_body)
