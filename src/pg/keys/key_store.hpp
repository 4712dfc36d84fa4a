// Where idempotency.idempotency_keys is read and changed: every read and
// transition of a key, done directly on the table and its primary key
// (pg/access/row_access.hpp) with the semantics of the SQL statements
// they stand for. The columns and what each write puts in them are
// pg/keys/key_row.hpp's; the insert of a new key is pg/keys/key_insert.hpp's.
// No SPI connection is needed, except by the sweeps' batches at the end,
// which stay SQL (cold paths, many rows each).
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/key_state.hpp"
#include "pg/access/row_access.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

// A stored key: its state for the decisions, and the values outcomes report
// (copied into the caller's memory).
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
    std::optional<Micros> claimed_at;  // when the current token was granted
    std::optional<Micros> retention;   // the retention its claim decided, if recorded
    Datum steps;  // jsonb, the finished steps (pg/keys/steps_value.hpp), when state.has_steps
};

// A plain read (SELECT): false when the key does not exist in this step's
// snapshot. Works in a read-only transaction and on a standby.
bool read_key(const KeyId& id, StoredKey* out);

// Under REPEATABLE READ or SERIALIZABLE, raises 40001 (could not serialize
// access) when a transaction that committed after this transaction's
// snapshot created, changed or removed the key: the snapshot cannot see
// what the key is now, so reading it again answers nothing new. Does
// nothing under READ COMMITTED.
void refuse_if_key_changed_since_snapshot(const KeyId& id);

// The key's row as a composite datum of the table's row type, or false.
bool key_row(const KeyId& id, Datum* row);

// A key's row found by this call to be changed. Trivially destructible;
// close it when done (a row lock stays until the transaction ends).
struct KeyRow {
    OpenTable table;
};
static_assert(std::is_trivially_destructible_v<KeyRow>);
// Finds the key to change it, as UPDATE ... WHERE finds the row (no lock
// yet): false when it does not exist. `row` must be closed either way.
bool find_key_to_change(const KeyId& id, StoredKey* out, KeyRow* row);
// Finds and locks it (SELECT ... FOR NO KEY UPDATE, as `lock` says): false
// when it does not exist, or when `lock` skips a row that another
// transaction holds (ForUpdateIfFree) or holds or waits to lock
// (ForUpdateIfNoneWaits; wait_for_key_lockers then waits for them in
// turn): a heartbeat that waited for a fenced transaction then renews the
// lease before a claim that comes as that transaction ends takes the key
// over.
bool lock_key(const KeyId& id, RowLock lock, StoredKey* out, KeyRow* row);
// Locks a key found without a lock, waiting for a concurrent change, and
// reads its newest version: false when it went away.
bool lock_found_key(KeyRow* row, StoredKey* out);
// After a change that answered Change::Again: the newest version, locked.
void reread_key(KeyRow* row, StoredKey* out);
void close_key(KeyRow* row);

// Waits until no other transaction holds a conflicting lock on the key's
// row or waits to lock it (those go first, in their order), without keeping
// a lock on it; false when `timeout` ran out first.
bool wait_for_key_lockers(const KeyId& id, Micros timeout);

// The transitions of a key found to change. Each is one UPDATE (or DELETE)
// of its row; see Change for what a concurrent change of the row answers.
//
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
Change grant_claim(KeyRow* row, const StoredKey& stored, const Grant& grant, Micros now,
                   std::int64_t* token, std::int32_t* attempts);

// PROCESSING -> COMPLETED (check_fence's Proceed, checked by the caller).
// It changes no indexed column (lease_until stays until the sweep settles
// the ended lease, purge_at is left to the sweep), so it is a HOT update;
// only a retention shorter than the lease left sets purge_at at once, or
// the key would outlive it.
Change complete_key(KeyRow* row, const StoredKey& stored, Datum result, bool has_result,
                  Micros now, Micros expires_at, std::optional<Micros> key_retention);

// A lease that ran out: FAILED_RETRYABLE or FAILED_FINAL with 'lease expired'.
Change expire_lease(KeyRow* row, Status next, Micros now, std::optional<Micros> expires_at);

// A failure the holder reported.
Change record_failure(KeyRow* row, Status next, const text* error, Micros now,
                    std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at,
                    std::optional<Micros> key_retention);

// A heartbeat: a new lease for a PROCESSING key.
Change renew_lease(KeyRow* row, Micros lease_until);

// A finished step recorded: `steps` is the key's steps with the new one.
Change record_steps(KeyRow* row, Datum steps);

// A release: back to RECEIVED with the attempt given back, or deleted.
Change release_to(KeyRow* row, const StoredKey& stored, Status next, Micros now);
// False when a trigger skipped it. The row must be locked.
bool delete_key(KeyRow* row);

// The sweeps' batches (background workers, idem_maintenance()): each
// changes at most `batch` keys and returns how many.
std::uint64_t expire_key_leases(int batch);         // PROCESSING past its lease
std::uint64_t expire_disconnected_keys(int batch);  // expire_on_disconnect: the holder has gone
std::uint64_t settle_key_leases(int batch);         // finished keys filed for retention
std::uint64_t purge_keys(int batch);  // past expires_at: deleted, its tombstone left

}  // namespace idem::pg
