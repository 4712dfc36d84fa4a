#include "pg/runtime/shared_memory.hpp"

#include "core/error.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

bool ready = false;
shmem_request_hook_type previous_request_hook = nullptr;
shmem_startup_hook_type previous_startup_hook = nullptr;

// All of the extension's shared memory, requested in one piece.
Size shared_memory_size() {
    Size size = 0;
    for (int i = 0; i < kSharedMemoryPartCount; ++i)
        size = add_size(size, MAXALIGN(kSharedMemoryParts[i].size()));
    return size;
}

void request_shared_memory() {
    if (previous_request_hook) previous_request_hook();
    RequestAddinShmemSpace(shared_memory_size());
    for (int i = 0; i < kSharedMemoryPartCount; ++i)
        if (kSharedMemoryParts[i].request_lock) kSharedMemoryParts[i].request_lock();
}

void start_shared_memory() {
    if (previous_startup_hook) previous_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    for (int i = 0; i < kSharedMemoryPartCount; ++i) kSharedMemoryParts[i].init();
    ready = true;
    LWLockRelease(AddinShmemInitLock);
}

}  // namespace

void install_shared_memory_hooks() {
    previous_request_hook = shmem_request_hook;
    shmem_request_hook = request_shared_memory;
    previous_startup_hook = shmem_startup_hook;
    shmem_startup_hook = start_shared_memory;
}

bool shared_memory_ready() { return ready; }

void require_shared_memory(const char* what) {
    if (!ready)
        throw Error("55000", std::string(what) +
                                 " needs the idempotency library to be loaded via "
                                 "shared_preload_libraries");
}

}  // namespace idem::pg
