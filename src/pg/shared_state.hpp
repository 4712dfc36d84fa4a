// The module's shared memory, present only when the library is preloaded:
// cumulative metrics, wake-up condition variables and the launcher's table
// of per-database workers.
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
inline constexpr int kMaxDatabases = 256;    // databases the launcher tracks

// What a database's last worker found there.
enum class DatabaseState : int { Unknown, HasExtension, NoExtension };

struct DatabaseSlot {
    Oid database;
    DatabaseState state;  // written by the worker, read by the launcher
};

struct SharedState {
    pg_atomic_uint64 counters[kCounterCount];
    pg_atomic_uint64 buckets[kBucketCount];
    slock_t mutex;                 // guards stats_reset and the database slots
    TimestampTz stats_reset;
    ConditionVariable wake[kWakeSlots];
    DatabaseSlot databases[kMaxDatabases];
};

// Null unless the library was preloaded (shared_preload_libraries).
SharedState* shared_state();

// Called from _PG_init while preloading: requests and initialises the memory.
void install_shared_state_hooks();

// Raises 55000 (object_not_in_prerequisite_state) when not preloaded.
SharedState* require_shared_state(const char* what);

}  // namespace idem::pg
