#include "pg/maintenance.hpp"

#include "pg/guard.hpp"
#include "pg/outbox_store.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"

namespace idem::pg {

namespace {

Statement kExpireLeases = {
    "WITH due AS (SELECT ctid FROM idempotency.idempotency_keys "
    "  WHERE status = 'PROCESSING' AND lease_until <= $1 LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE idempotency.idempotency_keys k SET "
    "  status = CASE WHEN k.attempts >= $3 THEN 'FAILED_FINAL' ELSE 'FAILED_RETRYABLE' END"
    "::idempotency.idem_status, "
    "  last_error = 'lease expired', lease_expired = true, next_attempt_at = $1, updated_at = $1, "
    "  expires_at = CASE WHEN k.attempts >= $3 THEN $1 + $4 END, holder_pid = NULL "
    "FROM due WHERE k.ctid = due.ctid AND k.status = 'PROCESSING'",
    4, {TIMESTAMPTZOID, INT4OID, INT4OID, INTERVALOID}, nullptr};

Statement kPurgeKeys = {
    "DELETE FROM idempotency.idempotency_keys WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM idempotency.idempotency_keys WHERE expires_at <= $1 "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

Statement kPurgeInbox = {
    "DELETE FROM idempotency.inbox WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM idempotency.inbox WHERE received_at <= $1 "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

Statement kPurgeLocks = {
    "DELETE FROM idempotency.locks WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM idempotency.locks WHERE expires_at <= $1 "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

Datum interval_of(Micros value) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = value;
    return IntervalPGetDatum(interval);
}

std::uint64_t expire_leases(int batch) {
    Params params;
    params.add_timestamp(GetCurrentTimestamp()).add_int4(batch).add_int4(settings::max_attempts);
    params.add(interval_of(settings::seconds(settings::retention_s)));
    return execute(kExpireLeases, params);
}

std::uint64_t purge(Statement& statement, Micros cutoff, int batch) {
    Params params;
    params.add_timestamp(cutoff).add_int4(batch);
    return execute(statement, params);
}

std::uint64_t purge_keys(int batch) { return purge(kPurgeKeys, GetCurrentTimestamp(), batch); }

std::uint64_t purge_inbox(int batch) {
    return purge(kPurgeInbox,
                 GetCurrentTimestamp() - settings::seconds(settings::inbox_retention_s), batch);
}

std::uint64_t purge_locks(int batch) { return purge(kPurgeLocks, GetCurrentTimestamp(), batch); }

std::uint64_t expire_outbox_leases(int batch) {
    return expire_event_leases(batch, settings::outbox_max_attempts, GetCurrentTimestamp());
}

std::uint64_t purge_outbox(int batch) {
    return purge_delivered_events(
        batch, GetCurrentTimestamp() - settings::seconds(settings::outbox_retention_s));
}

constexpr MaintenanceTask kTasks[] = {
    {"expire_leases", expire_leases},
    {"expire_outbox_leases", expire_outbox_leases},
    {"purge_keys", purge_keys},
    {"purge_outbox", purge_outbox},
    {"purge_inbox", purge_inbox},
    {"purge_locks", purge_locks},
};

// idem_maintenance(): every task until a batch comes back short.
Datum maintenance_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const int batch = settings::purge_batch;

    connect_spi();
    for (const MaintenanceTask& task : kTasks) {
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
    finish_spi();
    return 0;
}

}  // namespace

const MaintenanceTask* maintenance_tasks(int* count) {
    *count = static_cast<int>(sizeof kTasks / sizeof kTasks[0]);
    return kTasks;
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_maintenance, idem::pg::maintenance_body)
