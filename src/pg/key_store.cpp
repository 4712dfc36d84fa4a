#include "pg/key_store.hpp"

#include "pg/key_schema.hpp"
#include "pg/spi.hpp"
#include "pg/status_enum.hpp"

namespace idem::pg {

namespace {

// Columns of a key read, in this order, by kRead and the kReadForUpdate* statements.
#define KEY_COLUMNS                                                                   \
    "status, token, attempts, lease_until, next_attempt_at, fingerprint, result, "   \
    "last_error, job_ref, lease_expired, registered"
#define KEY_WHERE " WHERE scope = $1 AND key = $2"
#define KEYS " idempotency.idempotency_keys "
#define NEXT_TOKEN "pg_catalog.nextval('idempotency.token_seq'::pg_catalog.regclass)"

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

Statement kInsertClaimed = {
    "INSERT INTO" KEYS "(scope, key, status, token, attempts, lease_until, fingerprint, "
    "created_at, updated_at, claimed_at, holder_pid) "
    "VALUES ($1, $2, 'PROCESSING', " NEXT_TOKEN ", 1, $3, $4, $5, $5, $5, $6) "
    "ON CONFLICT (scope, key) DO NOTHING RETURNING token",
    6, {TEXTOID, TEXTOID, TIMESTAMPTZOID, BYTEAOID, TIMESTAMPTZOID, INT4OID}, nullptr};

Statement kInsertRegistered = {
    "INSERT INTO" KEYS "(scope, key, status, fingerprint, job_ref, registered, created_at, "
    "updated_at) VALUES ($1, $2, 'RECEIVED', $3, $4, true, $5, $5) "
    "ON CONFLICT (scope, key) DO NOTHING RETURNING true",
    5, {TEXTOID, TEXTOID, BYTEAOID, TEXTOID, TIMESTAMPTZOID}, nullptr};

// Each statement that sets expires_at comes in two layouts of the table
// (pg/key_schema.hpp): from 0.3.0 on it also keeps purge_at, the time the
// retention sweep finds the key by; before, it does not.
#define GRANT_SET                                                                               \
    "UPDATE" KEYS "SET status = 'PROCESSING', token = " NEXT_TOKEN ", attempts = attempts + 1, " \
    "lease_until = $3, fingerprint = COALESCE(fingerprint, $4), claimed_at = $5, updated_at = $5, " \
    "next_attempt_at = NULL, expires_at = NULL, lease_expired = false, holder_pid = $6, "       \
    "last_error = CASE WHEN $7 THEN 'lease expired' ELSE last_error END"
#define GRANT_RETURNING KEY_WHERE " RETURNING token, attempts"
#define GRANT_TYPES {TEXTOID, TEXTOID, TIMESTAMPTZOID, BYTEAOID, TIMESTAMPTZOID, INT4OID, BOOLOID}

Statement kGrant = {GRANT_SET ", purge_at = NULL" GRANT_RETURNING, 7, GRANT_TYPES, nullptr};
Statement kGrantBefore030 = {GRANT_SET GRANT_RETURNING, 7, GRANT_TYPES, nullptr};

// The WHERE clause is check_fence(Complete) == Proceed, written in SQL so
// that the common complete is one statement. It changes no indexed column
// (lease_until stays until the sweep settles the ended lease, purge_at is
// left to the sweep), so it is a HOT update; only a retention shorter than
// the lease left sets purge_at at once, or the key would outlive it.
#define COMPLETE_SET                                                                            \
    "UPDATE" KEYS "SET status = 'COMPLETED', result = $4, completed_at = $5, updated_at = $5, "  \
    "expires_at = $6, next_attempt_at = NULL, lease_expired = false, holder_pid = NULL"
#define COMPLETE_WHERE                                                                          \
    KEY_WHERE " AND token = $3 AND (status = 'PROCESSING' OR (lease_expired AND status IN "     \
    "('FAILED_RETRYABLE', 'FAILED_FINAL'))) "                                                   \
    "RETURNING attempts, result, job_ref, lease_until, claimed_at"
#define COMPLETE_TYPES {TEXTOID, TEXTOID, INT8OID, JSONBOID, TIMESTAMPTZOID, TIMESTAMPTZOID}

Statement kComplete = {
    COMPLETE_SET ", purge_at = CASE WHEN lease_until IS NULL OR $6 < lease_until THEN $6 "
    "ELSE purge_at END" COMPLETE_WHERE,
    6, COMPLETE_TYPES, nullptr};
Statement kCompleteBefore030 = {COMPLETE_SET COMPLETE_WHERE, 6, COMPLETE_TYPES, nullptr};

#define EXPIRE_SET                                                                              \
    "UPDATE" KEYS "SET status = $3::pg_catalog.text::idempotency.idem_status, "                 \
    "last_error = 'lease expired', lease_expired = true, next_attempt_at = $4, updated_at = $4, " \
    "expires_at = $5, holder_pid = NULL"
#define EXPIRE_TYPES {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}

Statement kExpire = {EXPIRE_SET ", purge_at = $5" KEY_WHERE, 5, EXPIRE_TYPES, nullptr};
Statement kExpireBefore030 = {EXPIRE_SET KEY_WHERE, 5, EXPIRE_TYPES, nullptr};

#define FAIL_SET                                                                                \
    "UPDATE" KEYS "SET status = $3::pg_catalog.text::idempotency.idem_status, last_error = $4, " \
    "updated_at = $5, next_attempt_at = $6, expires_at = $7, lease_expired = false, "           \
    "holder_pid = NULL"
#define FAIL_TYPES \
    {TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID}

Statement kFail = {FAIL_SET ", purge_at = $7" KEY_WHERE, 7, FAIL_TYPES, nullptr};
Statement kFailBefore030 = {FAIL_SET KEY_WHERE, 7, FAIL_TYPES, nullptr};

#define RENEW_SET                                                                   \
    "UPDATE" KEYS "SET lease_until = $3, updated_at = CASE WHEN status = 'PROCESSING' " \
    "THEN updated_at ELSE $4 END, status = 'PROCESSING', next_attempt_at = NULL, "  \
    "expires_at = NULL, lease_expired = false"
#define RENEW_TYPES {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}

Statement kRenew = {RENEW_SET ", purge_at = NULL" KEY_WHERE, 4, RENEW_TYPES, nullptr};
Statement kRenewBefore030 = {RENEW_SET KEY_WHERE, 4, RENEW_TYPES, nullptr};

#define RELEASE_SET                                                                              \
    "UPDATE" KEYS "SET status = $3::pg_catalog.text::idempotency.idem_status, token = NULL, "    \
    "attempts = attempts - 1, lease_until = NULL, next_attempt_at = $4, updated_at = $4, "       \
    "claimed_at = NULL, expires_at = NULL, lease_expired = false, holder_pid = NULL"
#define RELEASE_TYPES {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID}

Statement kRelease = {RELEASE_SET ", purge_at = NULL" KEY_WHERE, 4, RELEASE_TYPES, nullptr};
Statement kReleaseBefore030 = {RELEASE_SET KEY_WHERE, 4, RELEASE_TYPES, nullptr};

// The statement for the table's layout in this database.
Statement& for_layout(Statement& current, Statement& before_030) {
    return keys_have_purge_at() ? current : before_030;
}

Statement kDelete = {"DELETE FROM" KEYS KEY_WHERE, 2, {TEXTOID, TEXTOID}, nullptr};

Params key_params(const KeyId& id) {
    Params params;
    params.add_text(id.scope).add_text(id.key);
    return params;
}

Datum status_text(Status status) { return CStringGetTextDatum(status_label(status)); }

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
    return true;
}

void wait_for_key_lockers(const KeyId& id) {
    execute_in_subtransaction(kAwaitLockers, key_params(id), false, 1);
}

bool key_row(const KeyId& id, Datum* row) {
    if (execute(kRow, key_params(id), 1) == 0) return false;
    bool present = false;
    *row = column_copy(1, &present);
    return present;
}

bool insert_claimed(const KeyId& id, Micros lease_until, Datum fingerprint, bool has_fingerprint,
                    Micros now, std::int64_t* token) {
    Params params = key_params(id);
    params.add_timestamp(lease_until).add_datum(fingerprint, has_fingerprint);
    params.add_timestamp(now).add_int4(MyProcPid);
    if (execute(kInsertClaimed, params) == 0) return false;
    *token = *column_int8(1);
    return true;
}

bool insert_registered(const KeyId& id, Datum fingerprint, bool has_fingerprint,
                       const text* job_ref, Micros now) {
    Params params = key_params(id);
    params.add_datum(fingerprint, has_fingerprint).add_text(job_ref).add_timestamp(now);
    return execute(kInsertRegistered, params) > 0;
}

void grant_claim(const KeyId& id, Micros lease_until, Datum fingerprint, bool has_fingerprint,
                 bool takeover, Micros now, std::int64_t* token, std::int32_t* attempts) {
    Params params = key_params(id);
    params.add_timestamp(lease_until).add_datum(fingerprint, has_fingerprint);
    params.add_timestamp(now).add_int4(MyProcPid).add(BoolGetDatum(takeover));
    if (execute(for_layout(kGrant, kGrantBefore030), params) != 1) elog(ERROR, "idempotency: claimed key vanished");
    bool isnull = false;
    *token = *column_int8(1);
    *attempts = DatumGetInt32(column(2, &isnull));
}

bool complete_by_holder(const KeyId& id, std::int64_t token, Datum result, bool has_result,
                        Micros now, Micros expires_at, StoredKey* out,
                        std::optional<Micros>* claimed_at) {
    Params params = key_params(id);
    params.add_int8(token).add_datum(result, has_result).add_timestamp(now);
    params.add_timestamp(expires_at);
    if (execute(for_layout(kComplete, kCompleteBefore030), params) == 0) return false;
    bool isnull = false;
    out->state.status = Status::Completed;
    out->state.token = token;
    out->state.attempts = DatumGetInt32(column(1, &isnull));
    out->result = column_copy(2, &out->has_result);
    out->job_ref = column_copy(3, &out->has_job_ref);
    out->state.lease_until = column_timestamp(4);
    *claimed_at = column_timestamp(5);
    return true;
}

void expire_lease(const KeyId& id, Status next, Micros now, std::optional<Micros> expires_at) {
    Params params = key_params(id);
    params.add(status_text(next)).add_timestamp(now).add_timestamp(expires_at);
    execute(for_layout(kExpire, kExpireBefore030), params);
}

void record_failure(const KeyId& id, Status next, const text* error, Micros now,
                    std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at) {
    Params params = key_params(id);
    params.add(status_text(next)).add_text(error).add_timestamp(now);
    params.add_timestamp(next_attempt_at).add_timestamp(expires_at);
    execute(for_layout(kFail, kFailBefore030), params);
}

void renew_lease(const KeyId& id, Micros lease_until, Micros now) {
    Params params = key_params(id);
    params.add_timestamp(lease_until).add_timestamp(now);
    execute(for_layout(kRenew, kRenewBefore030), params);
}

void release_to(const KeyId& id, Status next, Micros now) {
    Params params = key_params(id);
    params.add(status_text(next)).add_timestamp(now);
    execute(for_layout(kRelease, kReleaseBefore030), params);
}

void delete_key(const KeyId& id) { execute(kDelete, key_params(id)); }

}  // namespace idem::pg
