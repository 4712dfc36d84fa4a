// Where idempotency.key_tombstones is read and purged. A tombstone is what
// is left of a finished key once its result's retention has passed (the
// keys' purge moves it there, pg/keys/key_store.hpp): enough to answer a
// late duplicate without running the work again, until forget_at.
#pragma once

#include <cstdint>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

struct Tombstone {
    Status status;  // COMPLETED or FAILED_FINAL
    Datum fingerprint;  // bytea, copied into the caller's memory
    bool has_fingerprint;
};

// A plain read by primary key: false when the key has no tombstone in this
// step's snapshot, or the installed version has no tombstones (before
// 0.7.0). Works in a read-only transaction and on a standby.
bool read_tombstone(const KeyId& id, Tombstone* out);

// The sweep's batch: deletes at most `batch` tombstones past forget_at.
std::uint64_t purge_tombstones(int batch);

}  // namespace idem::pg
