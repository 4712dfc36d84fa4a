// The module's shared memory, present only when the library is preloaded,
// requested and set up by one pair of hooks (shared_state.cpp). Its parts,
// and what guards each:
//   SharedState (here)      counters and histogram buckets: atomics;
//                           stats_reset: the spinlock `mutex`, held only to
//                           copy it.
//   the due table           per database, what is due and when: its LWLock
//                           (runtime/due_table.hpp).
//   the gauges              per database and scope or topic, the views'
//                           counts: their LWLock (stats/gauges.hpp).
//   the durations           per database and scope, how long completions
//                           took: an LWLock for the table, a spinlock per
//                           entry (stats/durations.hpp).
//   the notifier table      per database, the topics waiting for the outbox
//                           notifier: its LWLock (outbox/notifier_table.hpp).
//   the ready floor         the outbox's oldest possibly uncommitted id: a
//                           spinlock (outbox/ready_floor.hpp).
//   producer turns          commit counts per turn: atomics
//                           (outbox/producer_turn.hpp).
//   the waiter table        the sessions waiting for a key or a lock, by
//                           hash: a spinlock per bucket; each session's
//                           wake-up an atomic (waiting/waiter_table.hpp).
#pragma once

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/spin.h"
}

namespace idem::pg {

inline constexpr int kCounterCount = 20;     // the idem_metrics bigint columns
inline constexpr int kBucketCount = 10;      // processing_ms_buckets

struct SharedState {
    pg_atomic_uint64 counters[kCounterCount];
    pg_atomic_uint64 buckets[kBucketCount];
    slock_t mutex;                 // guards stats_reset
    TimestampTz stats_reset;
};

// Null unless the library was preloaded (shared_preload_libraries).
SharedState* shared_state();

// Called from _PG_init while preloading: requests and initialises the memory.
void install_shared_state_hooks();

// Raises 55000 (object_not_in_prerequisite_state) when not preloaded.
SharedState* require_shared_state(const char* what);

}  // namespace idem::pg
