// The insert of a new key, done directly on the table and its indexes
// (found by OID) instead of through SQL, so that it never waits for another
// transaction: where INSERT ... ON CONFLICT would wait for a transaction
// that is creating or deleting the same key, this answers Busy at once and
// the caller decides how long to wait (see wait_for_end). The insert is
// speculative, as PostgreSQL's own ON CONFLICT is: a concurrent insert of
// the same key that slips in between is seen by the unique index, and ours
// is taken back. The primary key is probed first: a key that exists costs
// no sequence value, no trigger and no row. Triggers on the table fire as
// for an INSERT that inserts.
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

struct NewKey {
    KeyId id;
    Status status;  // Processing (a claim) or Received (a register)
    Datum fingerprint;
    bool has_fingerprint;
    Micros now;
    // A claim: its lease, attempt cap and retention (the claim's settings).
    Micros lease_until;
    std::int32_t max_attempts;
    Micros retention;
    // A register.
    const text* job_ref;
};

enum class KeyInsert {
    Inserted,  // *token holds the new key's token (a claim)
    Exists,    // the key exists, committed (or made by this transaction)
    Busy,      // another transaction that has not ended is creating or deleting it
};

struct KeyInsertResult {
    KeyInsert outcome;
    std::int64_t token;
    TransactionId busy_with;  // for Busy
    // Set by the caller: the insert was taken back and the call answered
    // otherwise (a tombstone, pg/keys/tombstone_store.hpp).
    bool answered = false;
};

KeyInsertResult insert_key(const NewKey& key);

// Waits until transaction `xid` ends or `deadline` passes (then false).
bool wait_for_end(TransactionId xid, Micros deadline);

}  // namespace idem::pg
