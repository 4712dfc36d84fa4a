// One sweep of the housekeeping: expire leases, purge by retention.
// Each task works in batches of idempotency.purge_batch rows that skip rows
// an application transaction holds, so it never waits behind a claim.
#pragma once

#include <cstdint>

namespace idem::pg {

struct MaintenanceTask {
    const char* name;
    const char* table;   // the extension's table it works on
    const char* column;  // a column of it the task needs (nullptr: none)
    // Changes at most `batch` rows; returns how many it changed. Needs SPI.
    std::uint64_t (*run_batch)(int batch);
};

// Whether the installed version of the extension has the task's table (and
// column): a
// database not yet updated (ALTER EXTENSION ... UPDATE) to the library's
// version skips the tasks of newer objects. Needs a transaction.
bool task_applies(const MaintenanceTask& task);

// The tasks, in the order a sweep runs them; `count` receives their number.
const MaintenanceTask* maintenance_tasks(int* count);

}  // namespace idem::pg
