#include "pg/runtime/shared_memory.hpp"

#include "core/error.hpp"
#include "pg/outbox/notifier_table.hpp"
#include "pg/outbox/producer_turn.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/durations.hpp"
#include "pg/stats/gauges.hpp"
#include "pg/waiting/waiter_table.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

SharedState* state = nullptr;
shmem_request_hook_type previous_request_hook = nullptr;
shmem_startup_hook_type previous_startup_hook = nullptr;

// All of the extension's shared memory, requested and set up in one place.
Size shared_memory_size() {
    Size size = MAXALIGN(sizeof(SharedState));
    size = add_size(size, MAXALIGN(due_table_size()));
    size = add_size(size, notifier_table_size());
    size = add_size(size, ready_floor_size());
    size = add_size(size, gauges_size());
    size = add_size(size, durations_size());
    size = add_size(size, MAXALIGN(waiter_table_size()));
    return add_size(size, producer_turn_size());
}

void request_shared_memory() {
    if (previous_request_hook) previous_request_hook();
    RequestAddinShmemSpace(shared_memory_size());
    request_due_table_lock();
    request_notifier_table_lock();
    request_gauges_lock();
    request_durations_lock();
}

void start_shared_memory() {
    if (previous_startup_hook) previous_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    state = static_cast<SharedState*>(ShmemInitStruct("idempotency", sizeof(SharedState), &found));
    if (!found) {
        for (auto& counter : state->counters) pg_atomic_init_u64(&counter, 0);
        for (auto& bucket : state->buckets) pg_atomic_init_u64(&bucket, 0);
        SpinLockInit(&state->mutex);
        state->stats_reset = GetCurrentTimestamp();
    }
    init_due_table();
    init_notifier_table();
    init_ready_floor();
    init_producer_turns();
    init_gauges();
    init_durations();
    init_waiter_table();
    LWLockRelease(AddinShmemInitLock);
}

}  // namespace

SharedState* shared_state() { return state; }

void install_shared_state_hooks() {
    previous_request_hook = shmem_request_hook;
    shmem_request_hook = request_shared_memory;
    previous_startup_hook = shmem_startup_hook;
    shmem_startup_hook = start_shared_memory;
}

SharedState* require_shared_state(const char* what) {
    if (state == nullptr)
        throw Error("55000", std::string(what) +
                                 " needs the idempotency library to be loaded via "
                                 "shared_preload_libraries");
    return state;
}

}  // namespace idem::pg
