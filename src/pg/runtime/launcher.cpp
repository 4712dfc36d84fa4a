// The launcher: it starts a worker in a database only when something there
// is due, as the due table (pg/runtime/due_table.hpp) says: at once when a lease
// has ended (at most one worker per idempotency.naptime in a database), and
// spread out over the databases, like autovacuum's naptime, for the rest: a
// retention purge (at most every idempotency.purge_naptime in a database),
// the first sweep of a database it has not seen swept (after a start, a
// restart, or for a new database), a reload (SIGHUP asks for one sweep of
// every database), and rows of the extension's tables (or of pg_extension)
// changed other than by its functions or workers (seen in the cumulative
// statistics, looked at every launcher_naptime). Between two of these it sleeps until the earliest due
// time; a commit that makes something due earlier wakes it. Every
// idempotency.launcher_naptime it lists the databases. It also starts a
// database's outbox notifier as soon as a committing backend asks for one,
// up to idempotency.max_notifiers at once.
//
// Sweeps come before notifications, so that a lease ends on time however
// many databases have producers: while a sweep waits for a background
// worker slot, no notifier starts, and one running notifier is asked to
// leave to make room (its database's commits notify themselves meanwhile,
// as they do without a notifier).
#include <algorithm>
#include <cstring>

#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/launcher.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

PGDLLEXPORT void idem_launcher_main(Datum);
}

namespace idem::pg {

namespace {

struct Tracked {
    Oid database;
    int slot;                        // its entry in the due table; -1 when the table is full
    BackgroundWorkerHandle* handle;  // the database's current worker, if any
    bool running;                    // started and not yet seen stopped
    bool spread;                     // ... for work that can wait
    bool start_failed;               // logged once, until a start succeeds
    bool waits_for_slot;             // its last start found no free slot, and it is still due
    bool listed;                     // seen in the latest scan of pg_database
    TimestampTz last_start;          // 0: never
    TimestampTz last_retention;      // the start of its last worker that purged
    // Rows changed in the watched tables (cumulative statistics) that its
    // workers explain: the count when the last one started, plus what it
    // changed.
    std::uint64_t row_changes_expected;
    bool row_changes_known;
};

// Every database the launcher lists, however many (grown as needed).
Tracked* tracked = nullptr;
int tracked_count = 0;
int tracked_capacity = 0;
TimestampTz next_spread_start = 0;  // the next start of work that is spread out
TimestampTz overflow_warned = 0;

// The notifier last started for each slot of the notifier table.
struct TrackedNotifier {
    BackgroundWorkerHandle* handle;
    TimestampTz last_start;
    bool start_failed;  // logged once, until a start succeeds
    bool asked_to_leave;  // to make room for a sweep
};
TrackedNotifier notifiers[kNotifierSlots];
// Making room for a sweep was logged (once, until a sweep start succeeds).
bool room_making_logged = false;
// A notifier that fails at once is not restarted more often than this.
constexpr Micros kNotifierRestartPause = kSecond;
// How often at most a full due table is reported.
constexpr Micros kOverflowWarningPause = 300 * kSecond;

void fill_worker(BackgroundWorker* worker, const char* function, const char* type) {
    std::memset(worker, 0, sizeof *worker);
    worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
    strlcpy(worker->bgw_library_name, "idempotency", BGW_MAXLEN);
    strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
    strlcpy(worker->bgw_name, type, BGW_MAXLEN);
    strlcpy(worker->bgw_type, type, BGW_MAXLEN);
}

Tracked* add_tracked(Oid database) {
    if (tracked_count == tracked_capacity) {
        const int capacity = std::max(64, 2 * tracked_capacity);
        const Size bytes = sizeof(Tracked) * static_cast<Size>(capacity);
        tracked = static_cast<Tracked*>(tracked == nullptr
                                            ? MemoryContextAlloc(TopMemoryContext, bytes)
                                            : repalloc(tracked, bytes));
        tracked_capacity = capacity;
    }
    Tracked* added = &tracked[tracked_count++];
    *added = Tracked{database, due_slot_for(database), nullptr, false, false, false, false, false,
                     0, 0, 0, false};
    return added;
}

bool handle_running(BackgroundWorkerHandle* handle) {
    if (handle == nullptr) return false;
    pid_t pid;
    const BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);
    return status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED;
}

// Reads pg_database (a shared catalog: no database connection needed), and
// the row changes of the databases it lists.
void scan_databases(TimestampTz now) {
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
        Tracked* found = i < tracked_count ? &tracked[i] : add_tracked(database->oid);
        found->listed = true;
        // An entry the table had no room for before may fit now.
        if (found->slot < 0) found->slot = due_slot_for(found->database);
    }
    table_endscan(scan);
    table_close(relation, AccessShareLock);

    // Rows of the watched tables changed other than by the workers: a
    // restore, a manual UPDATE of the extension's tables, CREATE EXTENSION in
    // a database seen without it, or the extension's own functions (their
    // notes are in the due table already). What no note covers, a sweep
    // finds, at most every purge_naptime per database. A database where
    // none of these tables is written gets no sweep.
    const Micros recheck = settings::ms(settings::purge_naptime_ms);
    for (int i = 0; i < tracked_count; ++i) {
        Tracked& database = tracked[i];
        if (!database.listed || database.running || database.slot < 0) continue;
        DueView due;
        if (!read_due(database.slot, database.database, &due)) continue;
        const std::uint64_t changes = watched_row_changes(database.database, due.watched);
        if (!database.row_changes_known) {
            database.row_changes_expected = changes;
            database.row_changes_known = true;
        } else if (changes != database.row_changes_expected && now >= database.last_start + recheck) {
            want_sweep(database.slot, database.database);
            database.row_changes_expected = changes;
        }
    }
    CommitTransactionCommand();

    // Databases that are gone: forget them once their worker has stopped.
    int kept = 0;
    int overflow = 0;
    for (int i = 0; i < tracked_count; ++i) {
        if (tracked[i].listed || handle_running(tracked[i].handle)) {
            if (tracked[i].slot < 0) ++overflow;
            tracked[kept++] = tracked[i];
        } else {
            free_due_slot(tracked[i].slot, tracked[i].database);
        }
    }
    tracked_count = kept;
    if (overflow > 0 && (overflow_warned == 0 || now - overflow_warned >= kOverflowWarningPause)) {
        ereport(WARNING,
                (errmsg("idempotency launcher: %d of %d databases do not fit in "
                        "idempotency.max_databases = %d; each of them is swept every naptime",
                        overflow, tracked_count, settings::max_databases),
                 errhint("Raise idempotency.max_databases (takes a server restart).")));
        overflow_warned = now;
    }
}

// Whether the database still exists: a database dropped since the last
// scan gets no more workers (each would only fail to connect).
bool database_exists(Oid database) {
    StartTransactionCommand();
    const bool exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(database));
    CommitTransactionCommand();
    return exists;
}

void start_worker(Tracked* database, TimestampTz now, const char* reason) {
    BackgroundWorker worker;
    fill_worker(&worker, "idem_worker_main", "idempotency worker");
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    worker.bgw_main_arg = ObjectIdGetDatum(database->database);
    std::memcpy(worker.bgw_extra, &database->slot, sizeof database->slot);
    worker.bgw_notify_pid = MyProcPid;
    if (database->handle != nullptr) pfree(database->handle);
    database->handle = nullptr;
    mark_worker_started(database->slot, database->database);
    MemoryContext previous = MemoryContextSwitchTo(TopMemoryContext);
    const bool started = RegisterDynamicBackgroundWorker(&worker, &database->handle);
    MemoryContextSwitchTo(previous);
    // A start that found no slot is not a start: the database stays due, and
    // tries again as soon as a slot frees (a notifier asked to leave wakes
    // the launcher when it stops), ahead of any notifier.
    if (started) database->last_start = now;
    database->running = started;
    database->waits_for_slot = !started;
    if (started)
        ereport(DEBUG1, (errmsg_internal("idempotency launcher: worker for database %u: %s",
                                         database->database, reason)));
    else if (!database->start_failed)
        ereport(LOG, (errmsg("idempotency launcher: no free background worker slot for database %u; "
                             "raise max_worker_processes",
                             database->database)));
    database->start_failed = !started;
    if (started) room_making_logged = false;
}

bool sweep_waits_for_slot() {
    for (int i = 0; i < tracked_count; ++i)
        if (tracked[i].listed && tracked[i].waits_for_slot) return true;
    return false;
}

// A sweep found no free slot: the notifier started longest ago is asked to
// leave (an orderly exit: it sends what was published first), one at a
// time, until the sweep starts.
void make_room_for_sweep() {
    int oldest = -1;
    for (int slot = 0; slot < kNotifierSlots; ++slot) {
        const TrackedNotifier& notifier = notifiers[slot];
        if (!handle_running(notifier.handle)) continue;
        if (notifier.asked_to_leave) return;
        if (oldest < 0 || notifier.last_start < notifiers[oldest].last_start) oldest = slot;
    }
    if (oldest < 0) return;
    TerminateBackgroundWorker(notifiers[oldest].handle);
    notifiers[oldest].asked_to_leave = true;
    if (!room_making_logged)
        ereport(LOG, (errmsg("idempotency launcher: stopping an outbox notifier to free a "
                             "background worker slot for a sweep"),
                      errhint("Raise max_worker_processes, or lower idempotency.max_notifiers.")));
    room_making_logged = true;
}

// Workers seen stopped since the last look: one that did not finish its
// sweep (an error, a database wanted elsewhere) leaves its work due again.
void collect_stopped_workers(TimestampTz now) {
    for (int i = 0; i < tracked_count; ++i) {
        Tracked& database = tracked[i];
        if (!database.running || handle_running(database.handle)) continue;
        database.running = false;
        DueView due;
        if (!read_due(database.slot, database.database, &due)) continue;
        if (!due.sweep_finished)
            mark_worker_failed(database.slot, database.database,
                               now + settings::ms(settings::naptime_ms));
        else
            database.row_changes_expected = due.changes_at_start + due.changed;
    }
}

// Work that can wait is spread over the databases: one start every
// launcher_naptime / (databases with the extension), and at most this many
// such workers at once (a long purge in one database holds one of them;
// leases that end never wait for them).
constexpr int kSpreadWorkers = 2;

int spread_running() {
    int running = 0;
    for (int i = 0; i < tracked_count; ++i)
        if (tracked[i].running && tracked[i].spread) ++running;
    return running;
}

Micros spread_gap() {
    int served = 0;
    for (int i = 0; i < tracked_count; ++i) {
        DueView due;
        if (tracked[i].listed &&
            (!read_due(tracked[i].slot, tracked[i].database, &due) ||
             due.state != DatabaseState::NoExtension))
            ++served;
    }
    return settings::ms(settings::launcher_naptime_ms) / std::max(1, served);
}

// Starts the workers that are due; returns when the next one is.
TimestampTz launch_due_workers(TimestampTz now) {
    TimestampTz next = kNever;
    const Micros naptime = settings::ms(settings::naptime_ms);
    const Micros purge_naptime = settings::ms(settings::purge_naptime_ms);
    const Micros gap = spread_gap();
    int spread_slots = kSpreadWorkers - spread_running();
    for (int i = 0; i < tracked_count; ++i) {
        Tracked& database = tracked[i];
        if (!database.listed || database.running) continue;
        // A database gets at most one worker per naptime.
        const TimestampTz earliest = database.last_start == 0 ? 0 : database.last_start + naptime;
        DueView due;
        const bool has_entry = read_due(database.slot, database.database, &due);
        TimestampTz urgent_at = kNever;  // a lease has ended
        TimestampTz spread_at = kNever;  // work that can wait
        const char* reason = "lease ended";
        if (!has_entry) {
            // No room in the due table: swept every naptime, as before it existed.
            urgent_at = earliest;
            reason = "no room in the due table";
        } else {
            if (due.lease != kNever) urgent_at = std::max(due.lease, earliest);
            if (due.sweep_wanted) spread_at = earliest;
            if (due.retention != kNever)
                spread_at = std::min(spread_at, std::max({due.retention, earliest,
                                                          database.last_retention + purge_naptime}));
        }
        const bool urgent = urgent_at <= now;
        const bool spread =
            !urgent && spread_at <= now && now >= next_spread_start && spread_slots > 0;
        if (!urgent && !spread) {
            database.waits_for_slot = false;
            // With no spread slot free, the next spread worker that stops
            // wakes the launcher (it is their notify pid).
            const bool can_spread = spread_at != kNever && spread_slots > 0;
            next = std::min({next, urgent_at,
                             can_spread ? std::max(spread_at, next_spread_start) : kNever});
            continue;
        }
        if (!database_exists(database.database)) {
            database.listed = false;
            continue;
        }
        if (spread) {
            reason = due.sweep_wanted ? "sweep wanted" : "retention";
            next_spread_start = now + gap;
            --spread_slots;
        }
        start_worker(&database, now, reason);
        database.spread = spread;
        if (database.running && (!has_entry || due.sweep_wanted || due.retention <= now))
            database.last_retention = now;
        if (!database.running) {
            make_room_for_sweep();
            next = std::min(next, now + naptime);
        }
    }
    return next;
}

// A reload asks for one sweep of every database (the way to have rows
// written behind the extension's back looked at without waiting).
void want_every_sweep() {
    for (int i = 0; i < tracked_count; ++i) want_sweep(tracked[i].slot, tracked[i].database);
}

bool start_notifier(int slot, Oid database, TimestampTz now) {
    TrackedNotifier& notifier = notifiers[slot];
    BackgroundWorker worker;
    fill_worker(&worker, "idem_notifier_main", "idempotency notifier");
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    worker.bgw_main_arg = ObjectIdGetDatum(database);
    std::memcpy(worker.bgw_extra, &slot, sizeof slot);
    worker.bgw_notify_pid = MyProcPid;
    if (notifier.handle != nullptr) pfree(notifier.handle);
    notifier.handle = nullptr;
    notifier.asked_to_leave = false;
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
    return started;
}

int notifiers_running() {
    int running = 0;
    for (const TrackedNotifier& notifier : notifiers)
        if (handle_running(notifier.handle)) ++running;
    return running;
}

// Starts the notifiers committing backends asked for, up to
// idempotency.max_notifiers at once and none while a sweep waits for a
// slot; returns how long to sleep at most (ms).
long launch_wanted_notifiers(long sleep_ms) {
    if (sweep_waits_for_slot()) return sleep_ms;
    Oid wanted[kNotifierSlots];
    kNotifierDemand.wanted(wanted);
    const TimestampTz now = GetCurrentTimestamp();
    int room = settings::max_notifiers - notifiers_running();
    for (int slot = 0; slot < kNotifierSlots && room > 0; ++slot) {
        if (wanted[slot] == InvalidOid || handle_running(notifiers[slot].handle)) continue;
        const TimestampTz due = notifiers[slot].last_start + kNotifierRestartPause;
        if (now < due)
            sleep_ms = std::min<long>(sleep_ms, static_cast<long>((due - now) / kMillisecond) + 1);
        else if (!database_exists(wanted[slot]))
            kNotifierDemand.forget(slot, wanted[slot]);
        else if (start_notifier(slot, wanted[slot], now))
            --room;
    }
    return sleep_ms;
}

long sleep_ms_until(TimestampTz at, TimestampTz now) {
    if (at <= now) return 0;
    return static_cast<long>(std::min<Micros>((at - now + kMillisecond - 1) / kMillisecond, INT_MAX));
}

void launcher_loop() {
    kNotifierDemand.set_launcher_latch(MyLatch);
    set_due_launcher_latch(MyLatch);
    TimestampTz next_scan = 0;
    for (;;) {
        // Every note from here until the sleep wakes the launcher: it may
        // have read the table before the note arrived.
        publish_launcher_wake(kNever);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            want_every_sweep();
        }
        TimestampTz now = GetCurrentTimestamp();
        long sleep_ms = settings::launcher_naptime_ms;
        if (settings::worker_enabled) {
            collect_stopped_workers(now);
            if (now >= next_scan) {
                scan_databases(now);
                next_scan = now + settings::ms(settings::launcher_naptime_ms);
            }
            const TimestampTz next = std::min(launch_due_workers(now), next_scan);
            now = GetCurrentTimestamp();
            sleep_ms = launch_wanted_notifiers(sleep_ms_until(next, now));
        }
        publish_launcher_wake(now + settings::ms(static_cast<int>(std::min<long>(sleep_ms, INT_MAX))));
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, sleep_ms,
                        PG_WAIT_EXTENSION);
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
