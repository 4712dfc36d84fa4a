#include "pg/keys/key_store.hpp"

#include "pg/boundary/extension_objects.hpp"
#include "pg/boundary/spi.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/boundary/status_enum.hpp"
#include "pg/keys/transition_log.hpp"
#include "pg/shmem/metrics.hpp"

namespace idem::pg {

namespace {

// Columns of a key read, in this order, by kRead and the kReadForUpdate* statements.
#define KEY_COLUMNS                                                                   \
    "status, token, attempts, lease_until, next_attempt_at, fingerprint, result, "   \
    "last_error, job_ref, lease_expired, registered, "                                \
    "@if keys.max_attempts@max_attempts, retention"                                    \
    "@else@NULL::pg_catalog.int4, NULL::pg_catalog.interval@end@"
#define KEY_WHERE " WHERE scope = $1 AND key = $2"
#define KEYS " @keys@ "
#define NEXT_TOKEN "pg_catalog.nextval(@token_seq@)"
// From 0.3.0 on the table has purge_at, the time the retention sweep finds
// the key by; the statements that set expires_at keep it. Before, its sweep
// indexes followed status and expires_at. The library serves databases not
// yet updated, so each statement is written for the installed layout.
#define IF_PURGE_AT(text) "@if keys.purge_at@" text "@end@"

Statement kRead = {"SELECT " KEY_COLUMNS " FROM" KEYS KEY_WHERE, 2, {TEXTOID, TEXTOID}, nullptr};

Statement kReadForUpdate = {
    "SELECT " KEY_COLUMNS " FROM" KEYS KEY_WHERE " FOR NO KEY UPDATE", 2, {TEXTOID, TEXTOID},
    nullptr};

Statement kReadForUpdateIfFree = {
    "SELECT " KEY_COLUMNS " FROM" KEYS KEY_WHERE " FOR NO KEY UPDATE SKIP LOCKED", 2,
    {TEXTOID, TEXTOID}, nullptr};

// Run in a subtransaction that is rolled back: it only waits for lockers.
Statement kAwaitLockers = {
    "SELECT 1 FROM" KEYS KEY_WHERE " FOR NO KEY UPDATE", 2, {TEXTOID, TEXTOID}, nullptr};

Statement kRow = {"SELECT k FROM" KEYS "k" KEY_WHERE, 2, {TEXTOID, TEXTOID}, nullptr};

Statement kGrant = {
    "UPDATE" KEYS "SET status = 'PROCESSING', token = " NEXT_TOKEN ", attempts = attempts + 1, "
    "lease_until = $3, fingerprint = COALESCE(fingerprint, $4), claimed_at = $5, updated_at = $5, "
    "next_attempt_at = NULL, expires_at = NULL, lease_expired = false, holder_pid = $6, "
    "last_error = CASE WHEN $7 THEN 'lease expired' ELSE last_error END"
    IF_PURGE_AT(", purge_at = NULL")
    // A key the sweep settled is live again; one still live keeps its time,
    // and with it its entry in the live keys' index.
    "@if keys.active_since@, active_since = COALESCE(active_since, $5)@end@"
    "@if keys.max_attempts@, max_attempts = $8, retention = $9@end@"
    KEY_WHERE " RETURNING token, attempts",
    9, {TEXTOID, TEXTOID, TIMESTAMPTZOID, BYTEAOID, TIMESTAMPTZOID, INT4OID, BOOLOID, INT4OID,
        INTERVALOID}, nullptr};

// The WHERE clause is check_fence(Complete) == Proceed, written in SQL so
// that the common complete is one statement. It changes no indexed column
// (lease_until stays until the sweep settles the ended lease, purge_at is
// left to the sweep), so it is a HOT update; only a retention shorter than
// the lease left sets purge_at at once, or the key would outlive it.
Statement kComplete = {
    "UPDATE" KEYS "SET status = 'COMPLETED', result = $4, completed_at = $5, updated_at = $5, "
    "expires_at = $6, next_attempt_at = NULL, lease_expired = false, holder_pid = NULL"
    IF_PURGE_AT(", purge_at = CASE WHEN lease_until IS NULL OR $6 < lease_until THEN $6 "
                "ELSE purge_at END")
    KEY_WHERE " AND token = $3 AND (status = 'PROCESSING' OR (lease_expired AND status IN "
    "('FAILED_RETRYABLE', 'FAILED_FINAL'))) "
    "RETURNING attempts, result, job_ref, lease_until, claimed_at, "
    // The status a late completion left (as this statement's snapshot saw
    // it: PROCESSING before the sweep expired the lease, FAILED_* after);
    // read only when the lease had ended, by the subquery's lazy evaluation.
    "CASE WHEN lease_until IS NULL OR lease_until < $5 THEN (SELECT o.status FROM" KEYS "o "
    "  WHERE o.scope = $1 AND o.key = $2) END",
    6, {TEXTOID, TEXTOID, INT8OID, JSONBOID, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kExpire = {
    "UPDATE" KEYS "SET status = $3, last_error = 'lease expired', lease_expired = true, "
    "next_attempt_at = $4, updated_at = $4, expires_at = $5, holder_pid = NULL"
    IF_PURGE_AT(", purge_at = $5") KEY_WHERE,
    5, {TEXTOID, TEXTOID, kStatusType, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kFail = {
    "UPDATE" KEYS "SET status = $3, last_error = $4, updated_at = $5, next_attempt_at = $6, "
    "expires_at = $7, lease_expired = false, holder_pid = NULL"
    IF_PURGE_AT(", purge_at = $7") KEY_WHERE,
    7, {TEXTOID, TEXTOID, kStatusType, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID},
    nullptr};

Statement kRenew = {
    "UPDATE" KEYS "SET lease_until = $3 " KEY_WHERE " AND status = 'PROCESSING'",
    3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}, nullptr};

Statement kRelease = {
    "UPDATE" KEYS "SET status = $3, token = NULL, attempts = attempts - 1, lease_until = NULL, "
    "next_attempt_at = $4, updated_at = $4, claimed_at = NULL, expires_at = NULL, "
    "lease_expired = false, holder_pid = NULL" IF_PURGE_AT(", purge_at = NULL") KEY_WHERE,
    4, {TEXTOID, TEXTOID, kStatusType, TIMESTAMPTZOID}, nullptr};

Statement kDelete = {"DELETE FROM" KEYS KEY_WHERE, 2, {TEXTOID, TEXTOID}, nullptr};

Params key_params(const KeyId& id) {
    Params params;
    params.add_text(id.scope).add_text(id.key);
    return params;
}

// An idem_status value of the installed extension.
Datum status_value(Status status) { return status_datum(extension_objects().status_type, status); }

Datum interval_of(Micros value) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = value;
    return IntervalPGetDatum(interval);
}

}  // namespace

bool read_key(const KeyId& id, RowLock lock, StoredKey* out) {
    Statement& statement = lock == RowLock::ForUpdate         ? kReadForUpdate
                           : lock == RowLock::ForUpdateIfFree ? kReadForUpdateIfFree
                                                              : kRead;
    if (execute(statement, key_params(id), 1) == 0) return false;

    bool isnull = false;
    KeyState& state = out->state;
    state.status = status_from_datum(SPI_gettypeid(SPI_tuptable->tupdesc, 1), column(1, &isnull));
    state.token = column_int8(2);
    state.attempts = DatumGetInt32(column(3, &isnull));
    state.lease_until = column_timestamp(4);
    state.next_attempt_at = column_timestamp(5);
    out->fingerprint = column_copy(6, &out->has_fingerprint);
    out->result = column_copy(7, &out->has_result);
    out->last_error = column_copy(8, &out->has_last_error);
    out->job_ref = column_copy(9, &out->has_job_ref);
    state.lease_expired = DatumGetBool(column(10, &isnull));
    state.registered = DatumGetBool(column(11, &isnull));
    const Datum cap = column(12, &isnull);
    state.max_attempts = isnull ? std::nullopt : std::optional<std::int32_t>(DatumGetInt32(cap));
    Micros retention = 0;
    const Datum kept = column(13, &isnull);
    out->retention.reset();
    if (!isnull && interval_to_micros(DatumGetIntervalP(kept), &retention)) out->retention = retention;
    return true;
}

bool wait_for_key_lockers(const KeyId& id, Micros timeout) {
    return wait_within(kAwaitLockers, key_params(id), timeout);
}

bool key_row(const KeyId& id, Datum* row) {
    if (execute(kRow, key_params(id), 1) == 0) return false;
    bool present = false;
    *row = column_copy(1, &present);
    return present;
}

void grant_claim(const KeyId& id, const Grant& grant, Micros now, std::int64_t* token,
                 std::int32_t* attempts) {
    Params params = key_params(id);
    params.add_timestamp(grant.lease_until).add_datum(grant.fingerprint, grant.has_fingerprint);
    params.add_timestamp(now).add_int4(MyProcPid).add(BoolGetDatum(grant.takeover));
    params.add_int4(grant.max_attempts).add(interval_of(grant.retention));
    if (execute(kGrant, params) != 1) elog(ERROR, "idempotency: claimed key vanished");
    bool isnull = false;
    *token = *column_int8(1);
    *attempts = DatumGetInt32(column(2, &isnull));
}

bool complete_by_holder(const KeyId& id, std::int64_t token, Datum result, bool has_result,
                        Micros now, Micros expires_at, StoredKey* out,
                        std::optional<Micros>* claimed_at, Status* left) {
    Params params = key_params(id);
    params.add_int8(token).add_datum(result, has_result).add_timestamp(now);
    params.add_timestamp(expires_at);
    if (execute(kComplete, params) == 0) return false;
    bool isnull = false;
    out->state.status = Status::Completed;
    out->state.token = token;
    out->state.attempts = DatumGetInt32(column(1, &isnull));
    out->result = column_copy(2, &out->has_result);
    out->job_ref = column_copy(3, &out->has_job_ref);
    out->state.lease_until = column_timestamp(4);
    *claimed_at = column_timestamp(5);
    const Datum was = column(6, &isnull);
    *left = isnull ? Status::Processing
                   : status_from_datum(SPI_gettypeid(SPI_tuptable->tupdesc, 6), was);
    return true;
}

void expire_lease(const KeyId& id, Status next, Micros now, std::optional<Micros> expires_at) {
    Params params = key_params(id);
    params.add(status_value(next)).add_timestamp(now).add_timestamp(expires_at);
    execute(kExpire, params);
}

void record_failure(const KeyId& id, Status next, const text* error, Micros now,
                    std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at) {
    Params params = key_params(id);
    params.add(status_value(next)).add_text(error).add_timestamp(now);
    params.add_timestamp(next_attempt_at).add_timestamp(expires_at);
    execute(kFail, params);
}

void renew_lease(const KeyId& id, Micros lease_until) {
    Params params = key_params(id);
    params.add_timestamp(lease_until);
    execute(kRenew, params);
}

void release_to(const KeyId& id, Status next, Micros now) {
    Params params = key_params(id);
    params.add(status_value(next)).add_timestamp(now);
    execute(kRelease, params);
}

void delete_key(const KeyId& id) { execute(kDelete, key_params(id)); }

// ---------------------------------------------------------------- sweeps

// The background workers' and idem_maintenance()'s batches on the keys.
namespace {

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

std::uint64_t expire(Statement& statement, int batch, const char* reason) {
    Params params;
    params.add_timestamp(GetCurrentTimestamp()).add_int4(batch).add_int4(settings::max_attempts);
    params.add_interval(settings::seconds(settings::retention_s));
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

}  // namespace

std::uint64_t expire_key_leases(int batch) { return expire(kExpireLeases, batch, "lease expired"); }

// idempotency.expire_on_disconnect: claims whose backend has gone.
std::uint64_t expire_disconnected_keys(int batch) {
    if (!settings::expire_on_disconnect) return 0;
    return expire(kExpireDisconnected, batch, "holder disconnected");
}

std::uint64_t settle_key_leases(int batch) {
    return execute_due(kSettleLeases, GetCurrentTimestamp(), batch);
}

// COMPLETED / FAILED_FINAL --retention--> deleted: a transition to log.
std::uint64_t purge_keys(int batch) {
    const std::uint64_t purged = execute_due(kPurgeKeys, GetCurrentTimestamp(), batch);
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

}  // namespace idem::pg
