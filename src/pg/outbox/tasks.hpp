// The outbox's tasks in the housekeeping (runtime/tasks.hpp): each changes
// at most `batch` events and returns how many. Need SPI.
#pragma once

#include <cstdint>

namespace idem::pg {

// Events in flight past their lease: pending again, or dead after
// idempotency.outbox_max_attempts.
std::uint64_t expire_outbox_leases(int batch);
// Delivered events past idempotency.outbox_retention: deleted.
std::uint64_t purge_outbox(int batch);

}  // namespace idem::pg
