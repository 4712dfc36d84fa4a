// A per-database worker: takes what the due table says is due, checks that
// the extension is installed, reports that to the launcher, runs the lease
// tasks (expiry first), then, when something has passed its retention, the
// purges, and puts back the next due times it reads from the tables' indexes
// before it exits. Every task works in batches of idempotency.purge_batch
// rows, one transaction per batch; a purge pauses idempotency.purge_pause
// after each batch, and between two batches runs the lease tasks again when
// a lease has ended meanwhile, so no expiry waits behind a long purge.
// An error ends the worker; the launcher starts the next one a naptime later.
#include <algorithm>
#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/subscription_target.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/owner_scope.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/background_session.hpp"
#include "pg/runtime/database_yield.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/tasks.hpp"

extern "C" {
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"

PGDLLEXPORT void idem_worker_main(Datum);
}

namespace idem::pg {

namespace {

// The owner of the extension when it is installed in a schema of that
// owner's; InvalidOid otherwise (a schema that another role owns is not
// served: that role could have replaced what it holds). Reported to the
// launcher with the extension's tables, in the same transaction, which
// also reads the fence the database is behind (database_fence).
Oid served_by(int slot, Fence* fence) {
    StartTransactionCommand();
    const ExtensionObjects* objects = find_extension_objects();
    Oid owner = InvalidOid;
    Oid tables[kWatchedTables - 1] = {};
    if (objects != nullptr && schema_is_trusted(*objects)) {
        owner = objects->owner;
        const Oid found[] = {objects->keys, objects->outbox, objects->inbox, objects->locks};
        static_assert(sizeof found / sizeof found[0] == kWatchedTables - 1);
        std::memcpy(tables, found, sizeof found);
    } else if (objects != nullptr) {
        ereport(WARNING,
                (errmsg("idempotency worker: not serving database \"%s\": schema \"%s\" does "
                        "not belong to the extension's owner",
                        get_database_name(MyDatabaseId), get_namespace_name(objects->schema))));
    }
    report_state(slot, MyDatabaseId, OidIsValid(owner), tables);
    *fence = OidIsValid(owner) ? database_fence() : Fence::None;
    // A schema that another role owns is a matter for a human: look again
    // (and say so again) every launcher_naptime until it is put right.
    if (objects != nullptr && !OidIsValid(owner))
        mark_worker_failed(slot, MyDatabaseId,
                           GetCurrentTimestamp() + settings::ms(settings::launcher_naptime_ms));
    CommitTransactionCommand();
    return owner;
}

// Runs `work` in a transaction of its own, as the extension's owner (in a
// security-restricted operation, as autovacuum works as a table's owner:
// never as the worker's superuser), with SPI connected. Its constraints are
// all immediate: a deferred trigger on a table the work changes fires at
// the end of its statement, as the owner (queued for the commit, it would
// run after the switch back). Returns false,
// having done nothing, when the database is wanted by a command that needs
// the worker gone; checked before each transaction, so that such a command
// succeeds (the lock is the transaction's, released at its commit).
template <typename Work>
bool in_owner_transaction(Oid owner, const char* activity, Work work) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    if (database_wanted_elsewhere(MyDatabaseId)) {
        CommitTransactionCommand();
        return false;
    }
    const OwnerScope scope = enter_owner_scope_of(owner, true);
    ConstraintsSetStmt* all_immediate = makeNode(ConstraintsSetStmt);
    all_immediate->constraints = NIL;
    all_immediate->deferred = false;
    AfterTriggerSetState(all_immediate);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency worker: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
    work();
    SPI_finish();
    PopActiveSnapshot();
    leave_owner_scope(scope);
    CommitTransactionCommand();
    pgstat_report_stat(false);
    pgstat_report_activity(STATE_IDLE, nullptr);
    return true;
}

struct Sweep {
    int slot;
    Oid database;
    Oid owner;
    std::uint64_t changed;  // rows changed, for the launcher
    bool held;  // a command held a table: the sweep comes back a naptime later
};

// One batch of one task. False when the worker must leave.
bool run_batch(Sweep* sweep, const MaintenanceTask& task, int batch, std::uint64_t* changed_out) {
    *changed_out = 0;
    return in_owner_transaction(sweep->owner, task.name, [&] {
        // Tables that a command is changing (ALTER EXTENSION ... UPDATE
        // holds them exclusively) are left for a later sweep: a worker that
        // waited for one could deadlock with that command.
        if (!OidIsValid(task_table(task))) return;
        if (lock_task_tables_now(task))
            *changed_out = task.run_batch(batch);
        else
            sweep->held = true;
    });
}

// One task until a batch comes back short; `between` runs after each full
// batch. False when the worker must leave.
template <typename Between>
bool run_task(Sweep* sweep, const MaintenanceTask& task, std::uint64_t* total, Between between) {
    const int batch = settings::purge_batch;
    std::uint64_t changed = 0;
    do {
        CHECK_FOR_INTERRUPTS();
        if (!run_batch(sweep, task, batch, &changed)) return false;
        sweep->changed += changed;
        *total += changed;
        if (changed >= static_cast<std::uint64_t>(batch) && !between()) return false;
    } while (changed >= static_cast<std::uint64_t>(batch));
    return true;
}

bool run_lease_tasks(Sweep* sweep) {
    int count = 0;
    const MaintenanceTask* tasks = maintenance_tasks(&count);
    for (int i = 0; i < count; ++i) {
        std::uint64_t total = 0;
        if (tasks[i].kind == TaskKind::Lease && !run_task(sweep, tasks[i], &total, [] { return true; }))
            return false;
    }
    return true;
}

// Between two batches of a purge: a pause, so that the purge takes a share
// of the server and not all of it, and the leases that ended meanwhile.
bool between_purge_batches(Sweep* sweep) {
    if (settings::purge_pause_ms > 0) {
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        settings::purge_pause_ms, PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
    if (!lease_due_now(sweep->slot, sweep->database, GetCurrentTimestamp())) return true;
    (void)take_lease_due(sweep->slot, sweep->database);
    return run_lease_tasks(sweep);
}

bool run_retention_tasks(Sweep* sweep) {
    int count = 0;
    const MaintenanceTask* tasks = maintenance_tasks(&count);
    for (int i = 0; i < count; ++i) {
        const MaintenanceTask& task = tasks[i];
        if (task.kind != TaskKind::Retention) continue;
        std::uint64_t purged = 0;
        if (!run_task(sweep, task, &purged, [&] { return between_purge_batches(sweep); }))
            return false;
        // Statistics that still count the purged rows would have every
        // planner believe they are there: analyze after a large purge.
        if (purged >= static_cast<std::uint64_t>(settings::purge_batch) &&
            !in_owner_transaction(sweep->owner, "analyze after purge",
                                  [&] { (void)analyze_after_purge(task, purged); }))
            return false;
    }
    return true;
}

// Says once that the database went behind a fence (database_fence), or
// came out of one.
void say_fence(Fence before, Fence now) {
    StartTransactionCommand();  // for the names
    const char* database = get_database_name(MyDatabaseId);
    if (now == Fence::ReadOnly) {
        ereport(LOG, (errmsg("idempotency worker: database \"%s\" is read-only "
                             "(default_transaction_read_only): no lease is expired and nothing "
                             "purged there until it is writable again",
                             database)));
    } else if (now == Fence::Subscribed) {
        const char* subscription = feeding_subscription();
        ereport(LOG, (errmsg("idempotency worker: database \"%s\" receives the extension's tables "
                             "from subscription \"%s\": no lease is expired and nothing purged "
                             "there (its publisher's workers do that), and its counts are read "
                             "from the tables, until the subscription is dropped",
                             database, subscription != nullptr ? subscription : "?")));
    } else if (before == Fence::ReadOnly) {
        ereport(LOG, (errmsg("idempotency worker: database \"%s\" is writable again: its sweeps "
                             "resume",
                             database)));
    } else {
        ereport(LOG, (errmsg("idempotency worker: database \"%s\" no longer receives the "
                             "extension's tables from a subscription: its sweeps resume and its "
                             "counts are recounted",
                             database)));
    }
    CommitTransactionCommand();
}

void sweep() {
    Sweep sweep{-1, MyDatabaseId, InvalidOid, 0, false};
    std::memcpy(&sweep.slot, MyBgworkerEntry->bgw_extra, sizeof sweep.slot);
    const Micros start = GetCurrentTimestamp();
    // Taken before anything is read: what commits from now on is noted again.
    const DueTaken taken = take_due(sweep.slot, sweep.database, start);
    Fence fence = Fence::None;
    sweep.owner = served_by(sweep.slot, &fence);
    if (!OidIsValid(sweep.owner)) {
        put_next_due(sweep.slot, sweep.database, kNever, kNever, 0);
        return;
    }
    // A fenced database is left as it is: its due work comes back a
    // launcher naptime later, until the fence is lifted. Behind a
    // subscription its counts stay unknown, to be recounted once it is gone.
    const Fence before = note_fence(sweep.slot, sweep.database, fence);
    if (fence != before) say_fence(before, fence);
    if (fence == Fence::Subscribed) kBackgroundWork.forget_counts(sweep.database);
    if (fence != Fence::None) {
        mark_worker_failed(sweep.slot, sweep.database,
                           start + settings::ms(settings::launcher_naptime_ms));
        return;
    }
    // Every statement of the sweep finds its rows through an index.
    for (const char* scan : kFullScans) SetConfigOption(scan, "off", PGC_SUSET, PGC_S_OVERRIDE);
    if (!run_lease_tasks(&sweep)) return;
    // The views' counts, when unknown (after a start, an update, a request).
    // This and the next due read several tables: they take them all first,
    // without waiting (lock_extension_tables_now).
    if (!in_owner_transaction(sweep.owner, "idempotency: recount", [&] {
            if (lock_extension_tables_now(RowExclusiveLock))
                (void)kBackgroundWork.recount_if_unknown(true);
            else
                sweep.held = true;
        }))
        return;
    if ((taken.full || taken.retention <= start) && !run_retention_tasks(&sweep)) return;
    Micros lease = kNever;
    Micros retention = kNever;
    if (!in_owner_transaction(sweep.owner, "idempotency: next due",
                              [&] { sweep.held |= !read_next_due(&lease, &retention); }))
        return;
    if (sweep.held) {
        // What was left waits for the command to end, and not longer.
        const Micros soon = GetCurrentTimestamp() + settings::ms(settings::naptime_ms);
        lease = std::min(lease, soon);
        retention = std::min(retention, soon);
    }
    put_next_due(sweep.slot, sweep.database, lease, retention, sweep.changed);
}

}  // namespace

}  // namespace idem::pg

extern "C" void idem_worker_main(Datum main_arg) {
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
    idem::pg::use_background_session_settings();
    idem::pg::guarded_main("idempotency worker", idem::pg::sweep);
    proc_exit(0);
}
