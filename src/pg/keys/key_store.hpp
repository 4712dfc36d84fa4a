// Where the SQL of idempotency keys lives: every statement that reads or
// changes idempotency.idempotency_keys. Callers hold an SPI connection.
#pragma once

#include <cstdint>
#include <optional>

#include "core/key_state.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct KeyId {
    text* scope;
    text* key;
};

// A stored key: its state for the decisions, and the values outcomes report
// (copied out of SPI memory).
struct StoredKey {
    KeyState state;
    Datum fingerprint;
    bool has_fingerprint;
    Datum result;
    bool has_result;
    Datum last_error;
    bool has_last_error;
    Datum job_ref;
    bool has_job_ref;
    std::optional<Micros> retention;  // the retention its claim decided, if recorded
};

// ForUpdateIfFree locks the row only when no other transaction holds a
// conflicting lock on it, and otherwise reads nothing (see wait_for_key_lockers).
enum class RowLock { None, ForUpdate, ForUpdateIfFree };

// False when the key does not exist (in this statement's snapshot).
bool read_key(const KeyId& id, RowLock lock, StoredKey* out);

// Waits until no other transaction holds a conflicting lock on the key's
// row, without keeping a lock on it; false when `timeout` ran out first.
bool wait_for_key_lockers(const KeyId& id, Micros timeout);

// The key's row as a composite datum (copied out of SPI memory), or false.
bool key_row(const KeyId& id, Datum* row);

// An existing key becomes PROCESSING under a new token; attempts grows by one.
// A takeover ends an expired lease: it records 'lease expired' as last_error.
// The claim's attempt cap and retention are recorded for the sweep.
struct Grant {
    Micros lease_until;
    Datum fingerprint;
    bool has_fingerprint;
    bool takeover;
    std::int32_t max_attempts;
    Micros retention;
};
void grant_claim(const KeyId& id, const Grant& grant, Micros now, std::int64_t* token,
                 std::int32_t* attempts);

// PROCESSING -> COMPLETED when `token` is current and the call is allowed
// (check_fence's Proceed). False when no row qualified.
// On success `out` holds the completed key (its lease_until as it was),
// `claimed_at` when the token was granted and `left` the status it left.
bool complete_by_holder(const KeyId& id, std::int64_t token, Datum result, bool has_result,
                        Micros now, Micros expires_at, StoredKey* out,
                        std::optional<Micros>* claimed_at, Status* left);

// A lease that ran out: FAILED_RETRYABLE or FAILED_FINAL with 'lease expired'.
void expire_lease(const KeyId& id, Status next, Micros now, std::optional<Micros> expires_at);

// A failure the holder reported.
void record_failure(const KeyId& id, Status next, const text* error, Micros now,
                    std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at);

// A heartbeat: a new lease for a PROCESSING key.
void renew_lease(const KeyId& id, Micros lease_until);

// A release: back to RECEIVED or FAILED_RETRYABLE with the attempt given back.
void release_to(const KeyId& id, Status next, Micros now);
void delete_key(const KeyId& id);

// The sweeps' batches (background workers, idem_maintenance()): each
// changes at most `batch` keys and returns how many.
std::uint64_t expire_key_leases(int batch);         // PROCESSING past its lease
std::uint64_t expire_disconnected_keys(int batch);  // expire_on_disconnect: the holder has gone
std::uint64_t settle_key_leases(int batch);         // finished keys filed for retention
std::uint64_t purge_keys(int batch);                // past expires_at: deleted

}  // namespace idem::pg
