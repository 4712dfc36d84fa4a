// Resource locks (idempotency.locks): idem_lock and its kin, and the
// retention purge of expired locks.
#pragma once

#include <cstdint>

namespace idem::pg {

// Deletes at most `batch` locks whose time has run out; how many.
std::uint64_t purge_locks(int batch);

}  // namespace idem::pg
