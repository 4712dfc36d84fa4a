#include "pg/keys/key_store.hpp"

#include <algorithm>
#include <optional>

#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/status_enum.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/keys/transition_log.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/metrics.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/sequence.h"
}

namespace idem::pg {

namespace {

// Run in a subtransaction that is rolled back: it only waits for lockers.
// Only a claim that found the row held gets here, so it stays SQL.
Statement kAwaitLockers = {"SELECT 1 FROM @keys@ WHERE scope = $1 AND key = $2 FOR NO KEY UPDATE",
                           2,
                           {TEXTOID, TEXTOID},
                           nullptr};

const KeyColumns& columns_of(const KeyRow* key) { return key_columns(key->table.heap); }

// A change of the key's row, written from a copy of it.
KeyWrite begin_change(KeyRow* key) {
    KeyWrite write{};
    write.row = changed_row(&key->table);
    write.at = &columns_of(key);
    write.status_type = extension_objects().status_type;
    return write;
}

Change apply(KeyRow* key, const KeyWrite& write) {
    return update_found_row(&key->table, write.row, write.set, write.count);
}

}  // namespace

bool read_key(const KeyId& id, StoredKey* out) {
    const ExtensionObjects& objects = extension_objects();
    OpenTable table = open_to_read(objects.keys);
    const KeyIdValues key = key_id_values(id);
    const bool found = find_row(&table, key.values, RowLock::None);
    if (found) read_stored_key(table.found, key_columns(table.heap), objects.status_type, out);
    close_table(&table);
    return found;
}

void refuse_if_key_changed_since_snapshot(const KeyId& id) {
    if (!IsolationUsesXactSnapshot()) return;
    OpenTable table = open_to_read(extension_objects().keys);
    const KeyIdValues key = key_id_values(id);
    const bool changed = row_changed_since_snapshot(&table, key.values);
    close_table(&table);
    if (changed) throw_changed_since_snapshot(id, "another transaction changed it");
}

bool key_row(const KeyId& id, Datum* row) {
    OpenTable table = open_to_read(extension_objects().keys);
    const KeyIdValues key = key_id_values(id);
    const bool found = find_row(&table, key.values, RowLock::None);
    if (found) *row = found_row_datum(&table);
    close_table(&table);
    return found;
}

bool find_key_to_change(const KeyId& id, StoredKey* out, KeyRow* row) {
    const ExtensionObjects& objects = extension_objects();
    row->table = open_to_write(objects.keys);
    const KeyIdValues key = key_id_values(id);
    if (!find_row(&row->table, key.values, RowLock::None)) return false;
    read_stored_key(row->table.found, columns_of(row), objects.status_type, out);
    return true;
}

bool lock_key(const KeyId& id, RowLock lock, StoredKey* out, KeyRow* row) {
    const ExtensionObjects& objects = extension_objects();
    row->table = open_to_write(objects.keys);
    const KeyIdValues key = key_id_values(id);
    if (!find_row(&row->table, key.values, lock)) return false;
    read_stored_key(row->table.found, columns_of(row), objects.status_type, out);
    return true;
}

bool lock_found_key(KeyRow* row, StoredKey* out) {
    if (!lock_found_row(&row->table)) return false;
    reread_key(row, out);
    return true;
}

void reread_key(KeyRow* row, StoredKey* out) {
    read_stored_key(row->table.found, columns_of(row), extension_objects().status_type, out);
}

void close_key(KeyRow* row) { close_table(&row->table); }

bool wait_for_key_lockers(const KeyId& id, Micros timeout) {
    const Micros until = GetCurrentTimestamp() + timeout;
    // The row's waiters first: the lock below, taken as the row's holder
    // ends, would have the row before them (for a moment, but in every
    // round of a claim that waits).
    const Oid keys = extension_objects().keys;
    OpenTable table = open_to_read(keys);
    const KeyIdValues key = key_id_values(id);
    std::optional<ItemPointerData> version;
    if (find_row(&table, key.values, RowLock::None)) version = table.found->tts_tid;
    close_table(&table);
    if (version && !wait_for_row_waiters(keys, *version, timeout)) return false;
    timeout = until - GetCurrentTimestamp();
    if (timeout <= 0) return false;
    Params params;
    params.add_text(id.scope).add_text(id.key);
    connect_spi();
    const bool in_time = wait_within(kAwaitLockers, params, timeout);
    finish_spi();
    return in_time;
}

namespace {

// The next token of token_seq, greater than the key's last: a sequence set
// back below the key's tokens (the keys' table restored without it) is
// moved past them first, so that a key's tokens always grow.
std::int64_t token_above(std::optional<std::int64_t> last) {
    const Oid sequence = extension_objects().token_seq;
    std::int64_t token = nextval_internal(sequence, false);
    if (last && token <= *last) {
        DirectFunctionCall2(setval_oid, ObjectIdGetDatum(sequence), Int64GetDatum(*last));
        token = nextval_internal(sequence, false);
    }
    return token;
}

}  // namespace

Change grant_claim(KeyRow* key, const StoredKey& stored, const Grant& grant, Micros now,
                   std::int64_t* token, std::int32_t* attempts) {
    *token = token_above(stored.state.token);
    *attempts = stored.state.attempts + 1;
    KeyWrite write = begin_change(key);
    write_grant(&write, stored, grant, now, *token, *attempts);
    return apply(key, write);
}

Change complete_key(KeyRow* key, const StoredKey& stored, Datum result, bool has_result, Micros now,
                    Micros expires_at, std::optional<Micros> key_retention) {
    KeyWrite write = begin_change(key);
    write_completion(&write, stored, result, has_result, now, expires_at, key_retention);
    return apply(key, write);
}

Change expire_lease(KeyRow* key, Status next, Micros now, std::optional<Micros> expires_at) {
    KeyWrite write = begin_change(key);
    write_expiry(&write, next, now, expires_at);
    return apply(key, write);
}

Change record_failure(KeyRow* key, Status next, const text* error, Micros now,
                      std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at,
                      std::optional<Micros> key_retention) {
    KeyWrite write = begin_change(key);
    write_failure(&write, next, error, now, next_attempt_at, expires_at, key_retention);
    return apply(key, write);
}

Change renew_lease(KeyRow* key, Micros lease_until) {
    KeyWrite write = begin_change(key);
    write_renewal(&write, lease_until);
    return apply(key, write);
}

Change record_steps(KeyRow* key, Datum steps) {
    KeyWrite write = begin_change(key);
    write_steps(&write, steps);
    return apply(key, write);
}

Change release_to(KeyRow* key, const StoredKey& stored, Status next, Micros now) {
    KeyWrite write = begin_change(key);
    write_release(&write, stored, next, now);
    return apply(key, write);
}

bool delete_key(KeyRow* key) { return delete_found_row(&key->table); }

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
// Returns what is logged (and counted) of each key. From 0.7.0 a finished
// key leaves its tombstone, kept from when it finished for its own
// key_retention (retain_key) or else $3 (idempotency.key_retention), in the
// same statement: a claim sees the key or its tombstone, never neither. A
// retention of the tombstone that has already passed leaves none. A
// tombstone of the key already there (a row written behind the functions)
// is replaced by the newer. The digest and the fingerprint's prefix are
// computed as pg/keys/tombstone_digest.hpp and pg/keys/fingerprint.hpp say.
#define PURGED_COLUMNS "scope, key, status, token, attempts"
#define TEXT_BYTES(column)                                                              \
    "convert_to(" column ", CASE pg_catalog.getdatabaseencoding() WHEN 'SQL_ASCII' "    \
    "THEN 'SQL_ASCII' ELSE 'UTF8' END)"
#define TOMBSTONE_DIGEST                                                                \
    "encode(substr(sha256(" TEXT_BYTES("scope") " || decode('00', 'hex') || "           \
    TEXT_BYTES("key") "), 1, 16), 'hex')::uuid"
#define FINGERPRINT_PREFIX "('x' || encode(substr(fingerprint, 1, 4), 'hex'))::bit(32)::int4"
Statement kPurgeKeys = {
    "@if tombstones.key_digest@"
    "WITH gone AS (" PURGE_KEYS " RETURNING " PURGED_COLUMNS ", fingerprint, "
    "  COALESCE(completed_at, updated_at) "
    "  + @if keys.key_retention@COALESCE(key_retention, $3)@else@$3@end@ AS forget_at), "
    "kept AS (INSERT INTO @tombstones@ (key_digest, forget_at, fingerprint, status) "
    "  SELECT " TOMBSTONE_DIGEST ", forget_at, " FINGERPRINT_PREFIX ", status FROM gone "
    "  WHERE status IN ('COMPLETED', 'FAILED_FINAL') AND forget_at > $1 "
    "  ON CONFLICT (key_digest) DO UPDATE SET forget_at = EXCLUDED.forget_at, "
    "  fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status) "
    "SELECT " PURGED_COLUMNS ", forget_at FROM gone"
    "@else@" PURGE_KEYS " RETURNING " PURGED_COLUMNS ", NULL::pg_catalog.timestamptz@end@",
    3, {TIMESTAMPTZOID, INT4OID, INTERVALOID}, nullptr};

// The key of row `row` of a sweep's result, whose first columns are the
// key's identity (scope, key).
KeyId returned_key_id(std::uint64_t row) {
    bool isnull = false;
    return KeyId{DatumGetTextPP(column(1, &isnull, row)), DatumGetTextPP(column(2, &isnull, row))};
}

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
        log_transition(returned_key_id(row), Status::Processing,
                       final ? Status::FailedFinal : Status::FailedRetryable,
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

// COMPLETED / FAILED_FINAL --retention--> deleted (its tombstone left):
// a transition to log.
std::uint64_t purge_keys(int batch) {
    Params params;
    params.add_timestamp(GetCurrentTimestamp()).add_int4(batch);
    params.add_interval(settings::seconds(settings::key_retention_s));
    const std::uint64_t purged = execute(kPurgeKeys, params);
    // The tombstones' purge is due when the first of them is to be forgotten.
    Micros forget_first = kNever;
    for (std::uint64_t row = 0; row < purged; ++row) {
        const std::optional<Micros> forget_at = column_timestamp(6, row);
        if (forget_at) forget_first = std::min(forget_first, *forget_at);
    }
    if (forget_first != kNever) note_due_on_commit(DueKind::Retention, forget_first);
    for (std::uint64_t row = 0; row < purged; ++row) {
        bool isnull = false;
        const Status from =
            status_from_datum(SPI_gettypeid(SPI_tuptable->tupdesc, 3), column(3, &isnull, row));
        log_transition(returned_key_id(row), from, std::nullopt, column_int8(4, row),
                       DatumGetInt32(column(5, &isnull, row)), "retention");
    }
    return purged;
}

}  // namespace idem::pg
