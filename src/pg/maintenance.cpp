#include "pg/maintenance.hpp"

#include "pg/guard.hpp"
#include "pg/key_schema.hpp"
#include "pg/metrics.hpp"
#include "pg/outbox_store.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "pg/status_enum.hpp"
#include "pg/transition_log.hpp"

namespace idem::pg {

namespace {

// An expiry: FAILED_RETRYABLE, or FAILED_FINAL when attempts are exhausted.
#define EXPIRE_LEASES_OF(due_keys)                                                              \
    "WITH due AS (" due_keys " LIMIT $2 FOR NO KEY UPDATE OF k SKIP LOCKED) "                  \
    "UPDATE idempotency.idempotency_keys k SET "                                                \
    "  status = CASE WHEN k.attempts >= $3 THEN 'FAILED_FINAL' ELSE 'FAILED_RETRYABLE' END"     \
    "::idempotency.idem_status, "                                                               \
    "  last_error = 'lease expired', lease_expired = true, next_attempt_at = $1, "             \
    "  updated_at = $1, expires_at = CASE WHEN k.attempts >= $3 THEN $1 + $4 END, "            \
    "  holder_pid = NULL "                                                                      \
    "FROM due WHERE k.ctid = due.ctid AND k.status = 'PROCESSING' "                             \
    "RETURNING k.scope, k.key, k.token, k.attempts, k.status = 'FAILED_FINAL'"

Statement kExpireLeases = {
    EXPIRE_LEASES_OF("SELECT k.ctid FROM idempotency.idempotency_keys k "
                     "WHERE k.status = 'PROCESSING' AND k.lease_until <= $1"),
    4, {TIMESTAMPTZOID, INT4OID, INT4OID, INTERVALOID}, nullptr};

// A claim whose backend has exited: no backend with its pid, or only one
// that started after the claim (the pid was reused).
Statement kExpireDisconnected = {
    EXPIRE_LEASES_OF("SELECT k.ctid FROM idempotency.idempotency_keys k "
                     "WHERE k.status = 'PROCESSING' AND k.holder_pid IS NOT NULL "
                     "AND k.lease_until > $1 AND NOT EXISTS ("
                     "  SELECT 1 FROM pg_catalog.pg_stat_get_activity(NULL) a "
                     "  WHERE a.pid = k.holder_pid AND a.backend_start <= k.claimed_at)"),
    4, {TIMESTAMPTZOID, INT4OID, INT4OID, INTERVALOID}, nullptr};

// A lease that ended on a key no longer PROCESSING (completed, failed,
// expired above) leaves the leases index, and the key is filed for
// retention: complete does neither itself, so that it stays a HOT update.
Statement kSettleLeases = {
    "WITH due AS (SELECT ctid FROM idempotency.idempotency_keys "
    "  WHERE lease_until <= $1 AND status <> 'PROCESSING' "
    "  LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE idempotency.idempotency_keys k SET lease_until = NULL, purge_at = k.expires_at "
    "FROM due WHERE k.ctid = due.ctid AND k.status <> 'PROCESSING'",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

#define PURGE_KEYS_WHERE(due)                                                       \
    "DELETE FROM idempotency.idempotency_keys WHERE ctid = ANY (ARRAY("             \
    "  SELECT ctid FROM idempotency.idempotency_keys WHERE " due                   \
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))"
// purge_at is at most expires_at, except on a key completed late after an
// expiry to FAILED_FINAL until the sweep settles its lease: expires_at rules.
#define PURGE_KEYS PURGE_KEYS_WHERE("purge_at <= $1 AND expires_at <= $1")
// Before 0.3.0 the table has no purge_at; its expires_at is indexed.
#define PURGE_KEYS_BEFORE_030 PURGE_KEYS_WHERE("expires_at <= $1")
// With idempotency.log_transitions: also returns what is logged of each key.
#define LOGGED " RETURNING scope, key, status, token, attempts"

Statement kPurgeKeys = {PURGE_KEYS, 2, {TIMESTAMPTZOID, INT4OID}, nullptr};
Statement kPurgeKeysLogged = {PURGE_KEYS LOGGED, 2, {TIMESTAMPTZOID, INT4OID}, nullptr};
Statement kPurgeKeysBefore030 = {PURGE_KEYS_BEFORE_030, 2, {TIMESTAMPTZOID, INT4OID}, nullptr};
Statement kPurgeKeysLoggedBefore030 = {PURGE_KEYS_BEFORE_030 LOGGED, 2, {TIMESTAMPTZOID, INT4OID},
                                      nullptr};

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

std::uint64_t expire(Statement& statement, int batch, const char* reason) {
    Params params;
    params.add_timestamp(GetCurrentTimestamp()).add_int4(batch).add_int4(settings::max_attempts);
    params.add(interval_of(settings::seconds(settings::retention_s)));
    const std::uint64_t expired = execute(statement, params);
    count_on_commit(Counter::LeaseExpirations, expired);
    for (std::uint64_t row = 0; settings::log_transitions && row < expired; ++row) {
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
    const bool current = keys_have_purge_at();
    if (!settings::log_transitions)
        return run_due(current ? kPurgeKeys : kPurgeKeysBefore030, GetCurrentTimestamp(), batch);
    const std::uint64_t purged = run_due(current ? kPurgeKeysLogged : kPurgeKeysLoggedBefore030,
                                         GetCurrentTimestamp(), batch);
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
    {"expire_leases", "idempotency_keys", nullptr, expire_leases},
    {"expire_disconnected", "idempotency_keys", nullptr, expire_disconnected},
    {"settle_leases", "idempotency_keys", "purge_at", settle_leases},
    {"expire_outbox_leases", "outbox", nullptr, expire_outbox_leases},
    {"purge_keys", "idempotency_keys", nullptr, purge_keys},
    {"purge_outbox", "outbox", nullptr, purge_outbox},
    {"purge_inbox", "inbox", nullptr, purge_inbox},
    {"purge_locks", "locks", nullptr, purge_locks},
};

// idem_maintenance(): every task until a batch comes back short.
Datum maintenance_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const int batch = settings::purge_batch;

    connect_spi();
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
    finish_spi();
    return 0;
}

}  // namespace

bool task_applies(const MaintenanceTask& task) { return extension_has(task.table, task.column); }

const MaintenanceTask* maintenance_tasks(int* count) {
    *count = static_cast<int>(sizeof kTasks / sizeof kTasks[0]);
    return kTasks;
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_maintenance, idem::pg::maintenance_body)
