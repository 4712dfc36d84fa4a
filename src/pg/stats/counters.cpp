#include "pg/stats/counters.hpp"

#include "pg/runtime/shared_memory.hpp"

extern "C" {
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

SharedCounters* counters = nullptr;

}  // namespace

SharedCounters* shared_counters() { return counters; }

SharedCounters* require_shared_counters(const char* what) {
    require_shared_memory(what);
    return counters;
}

Size counters_size() { return sizeof(SharedCounters); }

void init_counters() {
    bool found = false;
    counters =
        static_cast<SharedCounters*>(ShmemInitStruct("idempotency", sizeof(SharedCounters), &found));
    if (found) return;
    for (auto& counter : counters->counters) pg_atomic_init_u64(&counter, 0);
    for (auto& bucket : counters->buckets) pg_atomic_init_u64(&bucket, 0);
    SpinLockInit(&counters->mutex);
    counters->stats_reset = GetCurrentTimestamp();
}

}  // namespace idem::pg
