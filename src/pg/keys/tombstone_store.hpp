// Where idempotency.key_tombstones is read and purged. A tombstone is what
// is left of a finished key once its result's retention has passed (the
// keys' purge moves it there, pg/keys/key_store.hpp): enough to answer a
// late duplicate without running the work again, until forget_at. It is
// found by a digest of the key's identity, not by the identity itself, so
// that a tombstone stays narrow (docs/keys.md#tombstones).
#pragma once

#include <cstdint>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

struct Tombstone {
    Status status;                   // COMPLETED or FAILED_FINAL
    std::int32_t fingerprint_prefix; // the first 4 bytes of the key's fingerprint
    bool has_fingerprint;
    Micros forget_at;
};

// A plain read by primary key: false when the key has no tombstone in this
// step's snapshot, or the installed version has no tombstones (before
// 0.7.0). Works in a read-only transaction and on a standby. While the
// table has never held a row (no block), it is not searched at all: the
// new-key path of a database without tombstones pays one look at the
// table's size.
bool read_tombstone(const KeyId& id, Tombstone* out);

// Under REPEATABLE READ or SERIALIZABLE, for a claim or register that has
// just inserted the key because neither it nor its tombstone was in the
// transaction's snapshot: raises 40001 when the key has a tombstone that a
// purge committed after that snapshot (the key was finished and purged
// meanwhile, so the work must not run again). Nothing under READ COMMITTED,
// whose statements see the purge.
void refuse_if_tombstone_made_since_snapshot(const KeyId& id);

// The sweep's batch: deletes at most `batch` tombstones past forget_at.
std::uint64_t purge_tombstones(int batch);

}  // namespace idem::pg
