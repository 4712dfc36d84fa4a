// The launcher: every idempotency.launcher_naptime it lists the databases;
// it starts a worker in each database with the extension every
// idempotency.naptime, and probes the others (a worker that finds no
// extension says so and exits) every launcher_naptime. It also starts a
// database's outbox notifier as soon as a committing backend asks for one.
#include <algorithm>
#include <cstring>

#include "pg/guard.hpp"
#include "pg/notifier_table.hpp"
#include "pg/settings.hpp"
#include "pg/shared_state.hpp"
#include "pg/workers.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "tcop/tcopprot.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

PGDLLEXPORT void idem_launcher_main(Datum);
}

namespace idem::pg {

namespace {

struct Tracked {
    Oid database;
    BackgroundWorkerHandle* handle;  // the database's current worker, if any
    TimestampTz last_start;
    bool listed;                     // seen in the latest scan of pg_database
};

Tracked tracked[kMaxDatabases];
int tracked_count = 0;

// The notifier last started for each slot of the notifier table.
struct TrackedNotifier {
    BackgroundWorkerHandle* handle;
    TimestampTz last_start;
    bool start_failed;  // logged once, until a start succeeds
};
TrackedNotifier notifiers[kNotifierSlots];
// A notifier that fails at once is not restarted more often than this.
constexpr Micros kNotifierRestartPause = kSecond;

void fill_worker(BackgroundWorker* worker, const char* function, const char* type) {
    std::memset(worker, 0, sizeof *worker);
    worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
    strlcpy(worker->bgw_library_name, "idempotency", BGW_MAXLEN);
    strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
    strlcpy(worker->bgw_name, type, BGW_MAXLEN);
    strlcpy(worker->bgw_type, type, BGW_MAXLEN);
}

// The slot of shared memory where the database's workers report.
int slot_of(Oid database) {
    SharedState* shared = shared_state();
    int free_slot = -1;
    SpinLockAcquire(&shared->mutex);
    for (int i = 0; i < kMaxDatabases; ++i) {
        if (shared->databases[i].database == database) {
            SpinLockRelease(&shared->mutex);
            return i;
        }
        if (free_slot < 0 && shared->databases[i].database == InvalidOid) free_slot = i;
    }
    if (free_slot >= 0) shared->databases[free_slot] = DatabaseSlot{database, DatabaseState::Unknown};
    SpinLockRelease(&shared->mutex);
    return free_slot;
}

DatabaseState state_of(int slot) {
    SharedState* shared = shared_state();
    SpinLockAcquire(&shared->mutex);
    const DatabaseState state = shared->databases[slot].state;
    SpinLockRelease(&shared->mutex);
    return state;
}

void forget_slot(Oid database) {
    SharedState* shared = shared_state();
    SpinLockAcquire(&shared->mutex);
    for (auto& slot : shared->databases)
        if (slot.database == database) slot = DatabaseSlot{InvalidOid, DatabaseState::Unknown};
    SpinLockRelease(&shared->mutex);
}

// Reads pg_database (a shared catalog: no database connection needed).
void scan_databases() {
    for (int i = 0; i < tracked_count; ++i) tracked[i].listed = false;
    StartTransactionCommand();
    (void)GetTransactionSnapshot();
    Relation relation = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(relation, 0, nullptr);
    HeapTuple tuple;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
        const auto* database = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
        // -2 in datconnlimit marks a database left invalid by an interrupted DROP.
        if (!database->datallowconn || database->datistemplate || database->datconnlimit == -2)
            continue;
        int i = 0;
        while (i < tracked_count && tracked[i].database != database->oid) ++i;
        if (i == tracked_count) {
            if (tracked_count == kMaxDatabases) continue;
            tracked[tracked_count++] = Tracked{database->oid, nullptr, 0, false};
        }
        tracked[i].listed = true;
    }
    table_endscan(scan);
    table_close(relation, AccessShareLock);
    CommitTransactionCommand();

    // Databases that are gone: forget them once their worker has stopped.
    int kept = 0;
    for (int i = 0; i < tracked_count; ++i) {
        pid_t pid;
        const bool running = tracked[i].handle != nullptr &&
                             GetBackgroundWorkerPid(tracked[i].handle, &pid) != BGWH_STOPPED;
        if (tracked[i].listed || running)
            tracked[kept++] = tracked[i];
        else
            forget_slot(tracked[i].database);
    }
    tracked_count = kept;
}

// A database dropped since the last scan gets no more workers (each would
// only fail to connect).
bool database_exists(Oid database) {
    StartTransactionCommand();
    const bool exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(database));
    CommitTransactionCommand();
    return exists;
}

bool handle_running(BackgroundWorkerHandle* handle) {
    if (handle == nullptr) return false;
    pid_t pid;
    const BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);
    return status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED;
}

bool worker_running(const Tracked& database) { return handle_running(database.handle); }

void start_worker(Tracked* database, int slot, TimestampTz now) {
    BackgroundWorker worker;
    fill_worker(&worker, "idem_worker_main", "idempotency worker");
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    worker.bgw_main_arg = ObjectIdGetDatum(database->database);
    std::memcpy(worker.bgw_extra, &slot, sizeof slot);
    worker.bgw_notify_pid = MyProcPid;
    if (database->handle != nullptr) pfree(database->handle);
    database->handle = nullptr;
    MemoryContext previous = MemoryContextSwitchTo(TopMemoryContext);
    const bool started = RegisterDynamicBackgroundWorker(&worker, &database->handle);
    MemoryContextSwitchTo(previous);
    database->last_start = now;
    if (!started)
        ereport(LOG, (errmsg("idempotency launcher: no free background worker slot for database %u; "
                             "raise max_worker_processes",
                             database->database)));
}

// Starts the workers that are due; returns how long to sleep (ms).
long launch_due_workers() {
    const TimestampTz now = GetCurrentTimestamp();
    Micros next = settings::ms(settings::naptime_ms);
    for (int i = 0; i < tracked_count; ++i) {
        Tracked& database = tracked[i];
        if (!database.listed || worker_running(database)) continue;
        const int slot = slot_of(database.database);
        if (slot < 0) continue;
        const bool has_extension = state_of(slot) == DatabaseState::HasExtension;
        const bool probed = state_of(slot) != DatabaseState::Unknown;
        const Micros interval = settings::ms(has_extension ? settings::naptime_ms
                                                           : settings::launcher_naptime_ms);
        const TimestampTz due = probed ? database.last_start + interval : now;
        if (now < due) {
            next = std::min(next, due - now);
        } else if (!database_exists(database.database)) {
            database.listed = false;
        } else {
            start_worker(&database, slot, now);
        }
    }
    return static_cast<long>(std::max<Micros>(10, next / kMillisecond));
}

void start_notifier(int slot, Oid database, TimestampTz now) {
    TrackedNotifier& notifier = notifiers[slot];
    BackgroundWorker worker;
    fill_worker(&worker, "idem_notifier_main", "idempotency notifier");
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    worker.bgw_main_arg = ObjectIdGetDatum(database);
    std::memcpy(worker.bgw_extra, &slot, sizeof slot);
    worker.bgw_notify_pid = MyProcPid;
    if (notifier.handle != nullptr) pfree(notifier.handle);
    notifier.handle = nullptr;
    MemoryContext previous = MemoryContextSwitchTo(TopMemoryContext);
    const bool started = RegisterDynamicBackgroundWorker(&worker, &notifier.handle);
    MemoryContextSwitchTo(previous);
    notifier.last_start = now;
    if (!started && !notifier.start_failed)
        ereport(LOG, (errmsg("idempotency launcher: no free background worker slot for the "
                             "outbox notifier of database %u; enqueuing transactions notify "
                             "in their own commits; raise max_worker_processes",
                             database)));
    notifier.start_failed = !started;
}

// Starts the notifiers committing backends asked for; returns how long to
// sleep at most (ms).
long launch_wanted_notifiers(long sleep_ms) {
    Oid wanted[kNotifierSlots];
    wanted_notifiers(wanted);
    const TimestampTz now = GetCurrentTimestamp();
    for (int slot = 0; slot < kNotifierSlots; ++slot) {
        if (wanted[slot] == InvalidOid || handle_running(notifiers[slot].handle)) continue;
        const TimestampTz due = notifiers[slot].last_start + kNotifierRestartPause;
        if (now < due)
            sleep_ms = std::min<long>(sleep_ms, static_cast<long>((due - now) / kMillisecond) + 1);
        else if (!database_exists(wanted[slot]))
            forget_notifier_slot(slot, wanted[slot]);
        else
            start_notifier(slot, wanted[slot], now);
    }
    return sleep_ms;
}

void launcher_loop() {
    set_launcher_latch(MyLatch);
    TimestampTz next_scan = 0;
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        long sleep_ms = settings::naptime_ms;
        if (settings::worker_enabled) {
            const TimestampTz now = GetCurrentTimestamp();
            if (now >= next_scan) {
                scan_databases();
                next_scan = now + settings::ms(settings::launcher_naptime_ms);
            }
            sleep_ms = launch_wanted_notifiers(launch_due_workers());
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, sleep_ms,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
    }
}

}  // namespace

void register_launcher() {
    BackgroundWorker worker;
    fill_worker(&worker, "idem_launcher_main", "idempotency launcher");
    worker.bgw_restart_time = 5;
    RegisterBackgroundWorker(&worker);
}

}  // namespace idem::pg

// Entry point: no C++ exception may leave it (the postmaster would see an
// abort and restart the whole cluster).
extern "C" void idem_launcher_main(Datum) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    idem::pg::guarded_main("idempotency launcher", idem::pg::launcher_loop);
}
