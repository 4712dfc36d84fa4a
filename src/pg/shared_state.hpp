// The module's shared memory, present only when the library is preloaded:
// cumulative metrics and wake-up condition variables, and (requested and
// initialised with them) the table of what is due in each database
// (pg/due_table.hpp) and the views' gauges (pg/gauges.hpp).
#pragma once

#include "pg/postgres.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/spin.h"
}

namespace idem::pg {

inline constexpr int kCounterCount = 20;     // the idem_metrics bigint columns
inline constexpr int kBucketCount = 10;      // processing_ms_buckets
inline constexpr int kWakeSlots = 256;       // condition variables, chosen by hash

struct SharedState {
    pg_atomic_uint64 counters[kCounterCount];
    pg_atomic_uint64 buckets[kBucketCount];
    slock_t mutex;                 // guards stats_reset
    TimestampTz stats_reset;
    ConditionVariable wake[kWakeSlots];
};

// Null unless the library was preloaded (shared_preload_libraries).
SharedState* shared_state();

// Called from _PG_init while preloading: requests and initialises the memory.
void install_shared_state_hooks();

// Raises 55000 (object_not_in_prerequisite_state) when not preloaded.
SharedState* require_shared_state(const char* what);

}  // namespace idem::pg
