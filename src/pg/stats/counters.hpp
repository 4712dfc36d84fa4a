// The counters behind idem_metrics in shared memory: atomics, and the time
// of the last reset under a spinlock held only to copy it. Written through
// metrics.hpp; a part of the module's shared memory.
#pragma once

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/spin.h"
}

namespace idem::pg {

inline constexpr int kCounterCount = 21;     // the idem_metrics bigint columns
inline constexpr int kBucketCount = 10;      // processing_ms_buckets

struct SharedCounters {
    pg_atomic_uint64 counters[kCounterCount];
    pg_atomic_uint64 buckets[kBucketCount];
    slock_t mutex;                 // guards stats_reset
    TimestampTz stats_reset;
};

// Null unless the library was preloaded (shared_preload_libraries).
SharedCounters* shared_counters();
// Raises 55000 (object_not_in_prerequisite_state) when not preloaded.
SharedCounters* require_shared_counters(const char* what);

// Its part of the shared memory.
Size counters_size();
void init_counters();

}  // namespace idem::pg
