// The wake-ups of prepared transactions. A commit signals the sessions
// waiting for what it changed (pg/waiting/wakeup.hpp); a prepared
// transaction commits later, at COMMIT PREPARED, in whichever session. Its
// wake-ups are parked at PREPARE TRANSACTION under its xid, in shared
// memory (library preloaded), and given by the session that runs COMMIT
// PREPARED (pg/boundary/prepared_end.hpp), once the commit is visible;
// ROLLBACK PREPARED drops them. Room: kParkedPerPrepared wake-ups for each of
// max_prepared_transactions. Those beyond it, and those of a transaction
// prepared before a restart, are not given: their waiters look again at
// the lease's end or their wait's.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

inline constexpr int kParkedPerPrepared = 64;

// Shared memory: called from the module's request and startup hooks.
Size prepared_wakeups_size();
void request_prepared_wakeups_lock();
void init_prepared_wakeups();

// At PREPARE TRANSACTION (nothing here raises an error): parks the first
// kParkedPerPrepared distinct wake-ups of `xid`, as many as there is room for.
void park_wakeups(TransactionId xid, const std::uint64_t* channels, int count);

// From _PG_init while preloading: gives them after COMMIT PREPARED.
void install_prepared_wakeups();

}  // namespace idem::pg
