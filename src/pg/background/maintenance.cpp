#include "pg/background/maintenance.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "core/error.hpp"
#include "pg/shmem/due_table.hpp"
#include "pg/background/gauge_recount.hpp"
#include "pg/shmem/gauges.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/shmem/shared_state.hpp"
#include "pg/boundary/extension_objects.hpp"
#include "pg/shmem/metrics.hpp"
#include "pg/outbox/outbox_store.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/boundary/spi.hpp"
#include "pg/boundary/status_enum.hpp"
#include "pg/keys/transition_log.hpp"

extern "C" {
#include "catalog/pg_class.h"
}

namespace idem::pg {

namespace {

// Every sweep statement orders the rows it picks by the column of the
// partial index that finds them: the planner then walks that index whatever
// the statistics say (a sequential scan would have to sort the whole table
// first), so a sweep reads only the rows due, even right after a mass purge
// left statistics that call every row due. The sweeps also run with the
// scans that read a whole table or index turned off (kFullScans), which
// leaves the planner plain index scans for the statements no order fits.

// An expiry: FAILED_RETRYABLE, or FAILED_FINAL when attempts are exhausted,
// by the attempt cap and retention the claim recorded (from 0.4.0), else
// the server's ($3, $4). $5 and $6 are the two statuses.
#define CAP "@if keys.max_attempts@COALESCE(k.max_attempts, $3)@else@$3@end@"
#define KEPT "@if keys.max_attempts@COALESCE(k.retention, $4)@else@$4@end@"
#define EXPIRE_LEASES_OF(due_keys)                                                              \
    "WITH due AS (" due_keys " LIMIT $2 FOR NO KEY UPDATE OF k SKIP LOCKED) "                  \
    "UPDATE @keys@ k SET "                                                                      \
    "  status = CASE WHEN k.attempts >= " CAP " THEN $5 ELSE $6 END, "                          \
    "  last_error = 'lease expired', lease_expired = true, next_attempt_at = $1, "             \
    "  updated_at = $1, expires_at = CASE WHEN k.attempts >= " CAP " THEN $1 + " KEPT " END, "  \
    "  holder_pid = NULL "                                                                      \
    "FROM due WHERE k.ctid = due.ctid AND k.status = 'PROCESSING' "                             \
    "RETURNING k.scope, k.key, k.token, k.attempts, k.status = 'FAILED_FINAL'"
#define EXPIRE_TYPES {TIMESTAMPTZOID, INT4OID, INT4OID, INTERVALOID, kStatusType, kStatusType}

// From 0.6.0 the live keys are found through their index (active_since),
// and lease_until is read from each; before, the leases index held the
// leases not yet settled.
#define LIVE_KEYS_BY_LEASE(lease_clause)                                        \
    "SELECT k.ctid FROM @keys@ k WHERE k.status = 'PROCESSING' AND " lease_clause \
    "@if keys.active_since@ AND k.active_since IS NOT NULL ORDER BY k.active_since" \
    "@else@ ORDER BY k.lease_until@end@"

Statement kExpireLeases = {EXPIRE_LEASES_OF(LIVE_KEYS_BY_LEASE("k.lease_until <= $1")), 6,
                           EXPIRE_TYPES, nullptr};

// A claim whose backend has exited: no backend with its pid, or only one
// that started after the claim (the pid was reused).
Statement kExpireDisconnected = {
    EXPIRE_LEASES_OF(LIVE_KEYS_BY_LEASE(
        "k.holder_pid IS NOT NULL AND k.lease_until > $1 AND NOT EXISTS ("
        "  SELECT 1 FROM pg_catalog.pg_stat_get_activity(NULL) a "
        "  WHERE a.pid = k.holder_pid AND a.backend_start <= k.claimed_at)")),
    6, EXPIRE_TYPES, nullptr};

// A key that has left the live states (completed, failed, expired above)
// leaves the live keys' index, its lease is cleared and it is filed for
// retention: complete and fail do none of it themselves, so that they stay
// HOT updates. From 0.6.0 at the next sweep (the next due time of a key not
// settled yet is now); before, once its lease had ended, and the leases
// index held it until then.
Statement kSettleLeases = {
    "@if keys.active_since@"
    "WITH due AS (SELECT ctid FROM @keys@ "
    "  WHERE active_since IS NOT NULL AND status NOT IN ('RECEIVED', 'PROCESSING') "
    "  ORDER BY active_since LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE @keys@ k SET active_since = NULL, lease_until = NULL, purge_at = k.expires_at "
    "FROM due WHERE k.ctid = due.ctid AND k.status NOT IN ('RECEIVED', 'PROCESSING')"
    "@else@"
    "WITH due AS (SELECT ctid FROM @keys@ "
    "  WHERE lease_until <= $1 AND status <> 'PROCESSING' ORDER BY lease_until "
    "  LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE @keys@ k SET lease_until = NULL, purge_at = k.expires_at "
    "FROM due WHERE k.ctid = due.ctid AND k.status <> 'PROCESSING'"
    "@end@",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

// purge_at is at most expires_at, except on a key completed late after an
// expiry to FAILED_FINAL until the sweep settles its lease: expires_at
// rules. Before 0.3.0 the table has no purge_at; its expires_at is indexed.
#define PURGE_KEYS                                                                 \
    "DELETE FROM @keys@ WHERE ctid = ANY (ARRAY("                                  \
    "  SELECT ctid FROM @keys@ WHERE "                                             \
    "@if keys.purge_at@purge_at <= $1 AND @end@expires_at <= $1"                   \
    "  ORDER BY @if keys.purge_at@purge_at@else@expires_at@end@"                   \
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))"
// Returns what is logged (and counted) of each key.
Statement kPurgeKeys = {PURGE_KEYS " RETURNING scope, key, status, token, attempts", 2,
                        {TIMESTAMPTZOID, INT4OID}, nullptr};

Statement kPurgeInbox = {
    "DELETE FROM @inbox@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @inbox@ WHERE received_at <= $1 ORDER BY received_at "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

Statement kPurgeLocks = {
    "DELETE FROM @locks@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @locks@ WHERE expires_at <= $1 ORDER BY expires_at "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

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

Datum interval_of(Micros value) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = value;
    return IntervalPGetDatum(interval);
}

std::uint64_t expire(Statement& statement, int batch, const char* reason) {
    Params params;
    params.add_timestamp(GetCurrentTimestamp()).add_int4(batch).add_int4(settings::max_attempts);
    params.add(interval_of(settings::seconds(settings::retention_s)));
    const Oid status_type = extension_objects().status_type;
    params.add(status_datum(status_type, Status::FailedFinal));
    params.add(status_datum(status_type, Status::FailedRetryable));
    const std::uint64_t expired = execute(statement, params);
    count_on_commit(Counter::LeaseExpirations, expired);
    for (std::uint64_t row = 0; row < expired; ++row) {
        bool isnull = false;
        const bool final = DatumGetBool(column(5, &isnull, row));
        log_transition(DatumGetTextPP(column(1, &isnull, row)), DatumGetTextPP(column(2, &isnull, row)),
                       Status::Processing, final ? Status::FailedFinal : Status::FailedRetryable,
                       column_int8(3, row), DatumGetInt32(column(4, &isnull, row)), reason);
    }
    return expired;
}

std::uint64_t expire_leases(int batch) { return expire(kExpireLeases, batch, "lease expired"); }

// idempotency.expire_on_disconnect: claims whose backend has gone.
std::uint64_t expire_disconnected(int batch) {
    if (!settings::expire_on_disconnect) return 0;
    return expire(kExpireDisconnected, batch, "holder disconnected");
}

// Runs a batch statement over the rows due by `cutoff` ($1), at most `batch` ($2).
std::uint64_t run_due(Statement& statement, Micros cutoff, int batch) {
    Params params;
    params.add_timestamp(cutoff).add_int4(batch);
    return execute(statement, params);
}

std::uint64_t settle_leases(int batch) {
    return run_due(kSettleLeases, GetCurrentTimestamp(), batch);
}

// COMPLETED / FAILED_FINAL --retention--> deleted: a transition to log.
std::uint64_t purge_keys(int batch) {
    const std::uint64_t purged = run_due(kPurgeKeys, GetCurrentTimestamp(), batch);
    for (std::uint64_t row = 0; row < purged; ++row) {
        bool isnull = false;
        const Status from =
            status_from_datum(SPI_gettypeid(SPI_tuptable->tupdesc, 3), column(3, &isnull, row));
        log_transition(DatumGetTextPP(column(1, &isnull, row)), DatumGetTextPP(column(2, &isnull, row)),
                       from, std::nullopt, column_int8(4, row), DatumGetInt32(column(5, &isnull, row)),
                       "retention");
    }
    return purged;
}

std::uint64_t purge_inbox(int batch) {
    return run_due(kPurgeInbox,
                 GetCurrentTimestamp() - settings::seconds(settings::inbox_retention_s), batch);
}

std::uint64_t purge_locks(int batch) { return run_due(kPurgeLocks, GetCurrentTimestamp(), batch); }

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
    {"expire_leases", "idempotency_keys", nullptr, TaskKind::Lease, expire_leases},
    {"expire_disconnected", "idempotency_keys", nullptr, TaskKind::Lease, expire_disconnected},
    {"settle_leases", "idempotency_keys", "purge_at", TaskKind::Lease, settle_leases},
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
    params.add(interval_of(settings::seconds(settings::outbox_retention_s)));
    params.add(interval_of(settings::seconds(settings::inbox_retention_s)));
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
