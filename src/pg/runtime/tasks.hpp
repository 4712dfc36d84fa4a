// One sweep of the housekeeping: expire leases, purge by retention.
// Each task works in batches of idempotency.purge_batch rows that skip rows
// an application transaction holds, so it never waits behind a claim.
// The tasks belong to the wings whose tables they work on; the module
// lists them (module.cpp), and the worker (worker.cpp) and idem_maintenance()
// (maintenance_functions.cpp) run them from that list.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"
#include "pg/runtime/due_table.hpp"

namespace idem::pg {

// Lease tasks run whenever a worker comes: they are what a lease end needs.
// Retention tasks run when something has passed its retention, between two
// of which the worker runs the lease tasks again when a lease has ended.
enum class TaskKind { Lease, Retention };

struct MaintenanceTask {
    const char* name;
    const char* table;   // the extension's table it works on
    const char* column;  // a column of it the task needs (nullptr: none)
    TaskKind kind;
    // Changes at most `batch` rows; returns how many it changed. Needs SPI.
    std::uint64_t (*run_batch)(int batch);
    // Another table of the extension it writes (nullptr: none).
    const char* also_writes = nullptr;
};

// What the module gives the housekeeping: the tasks, and the views' counts
// (stats/recount.hpp), which the worker recounts between the lease and the
// retention tasks when they are unknown.
struct BackgroundWork {
    const MaintenanceTask* tasks;  // in the order a sweep runs them
    int task_count;
    // Recounts when the counts are unknown (with `repair`, first gives the
    // live keys written behind the functions the active_since they lack).
    bool (*recount_if_unknown)(bool repair);
    // A database's counts are forgotten: the next sweep recounts them.
    void (*forget_counts)(Oid database);
};
// Defined by the module.
extern const BackgroundWork kBackgroundWork;

// Whether the installed version of the extension has the task's table (and
// column): a
// database not yet updated (ALTER EXTENSION ... UPDATE) to the library's
// version skips the tasks of newer objects. Needs a transaction.
bool task_applies(const MaintenanceTask& task);
// The table the task works on, or InvalidOid when it does not apply.
Oid task_table(const MaintenanceTask& task);

// The tasks, in the order a sweep runs them; `count` receives their number.
const MaintenanceTask* maintenance_tasks(int* count);

// Planner settings a sweep runs with off: sequential and bitmap scans,
// which read a whole table or index range however few rows are due.
inline constexpr const char* kFullScans[] = {"enable_seqscan", "enable_bitmapscan"};

// Takes `mode` on every table of the extension without waiting. A worker's
// transaction that reads or writes several of them does this first, so
// that it never holds one while it waits for another: a command that
// changes them (ALTER EXTENSION ... UPDATE, a DBA's ALTER TABLE) takes them
// in its own order, and a worker that waited on it could deadlock with it.
// False when a command holds one of them or waits for it; the worker then
// comes back later. Needs a transaction.
bool lock_extension_tables_now(LOCKMODE mode);
// The same for the tables a task writes (its own, and also_writes), so that
// a command holding another table holds up no other task.
bool lock_task_tables_now(const MaintenanceTask& task);

// The next times something is due, read from the tables' indexes: the
// earliest lease end (keys and outbox events) and the earliest retention
// deadline (keys, delivered events, inbox rows, locks); kNever for none.
// False, with nothing read, when a command holds one of the tables
// (lock_extension_tables_now). Needs SPI.
bool read_next_due(Micros* lease, Micros* retention);

// A purge that removed at least this share of the rows the table's
// statistics counted leaves them calling every row due: analyze it.
inline constexpr double kAnalyzeShare = 0.1;
// After a retention task's pass that purged `purged` rows: ANALYZE of its
// table when that was a large share of it. Needs SPI; true when analyzed.
bool analyze_after_purge(const MaintenanceTask& task, std::uint64_t purged);

}  // namespace idem::pg
