// The module's shared memory, present only when the library is preloaded,
// requested and set up by one pair of hooks (shared_memory.cpp) that call
// each part of the table the module fills (module.cpp, which also says what
// guards each part). A part knows its own size, lock and set-up; this file
// knows none of them.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct SharedMemoryPart {
    Size (*size)();
    void (*request_lock)();  // nullptr: the part has no LWLock of its own
    void (*init)();          // called under AddinShmemInitLock
};

// The parts, in the order they are set up; defined by the module.
extern const SharedMemoryPart kSharedMemoryParts[];
extern const int kSharedMemoryPartCount;

// Called from _PG_init while preloading: requests and initialises the memory.
void install_shared_memory_hooks();

// False unless the library was preloaded (shared_preload_libraries).
bool shared_memory_ready();

// Raises 55000 (object_not_in_prerequisite_state) when not preloaded.
void require_shared_memory(const char* what);

}  // namespace idem::pg
