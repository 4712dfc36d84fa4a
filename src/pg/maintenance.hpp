// One sweep of the housekeeping: expire leases, purge by retention.
// Each task works in batches of idempotency.purge_batch rows that skip rows
// an application transaction holds, so it never waits behind a claim.
#pragma once

#include <cstdint>

namespace idem::pg {

struct MaintenanceTask {
    const char* name;
    // Changes at most `batch` rows; returns how many it changed. Needs SPI.
    std::uint64_t (*run_batch)(int batch);
};

// The tasks, in the order a sweep runs them; `count` receives their number.
const MaintenanceTask* maintenance_tasks(int* count);

}  // namespace idem::pg
