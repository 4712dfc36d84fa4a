// A per-database worker: checks that the extension is installed, reports
// that to the launcher, runs each maintenance task in batches of
// idempotency.purge_batch rows, one transaction per batch, and exits.
// An error ends the worker; the launcher starts the next one a naptime later.
#include <cstring>

#include "pg/database_yield.hpp"
#include "pg/extension_objects.hpp"
#include "pg/maintenance.hpp"
#include "pg/guard.hpp"
#include "pg/owner_scope.hpp"
#include "pg/settings.hpp"
#include "pg/shared_state.hpp"

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
// served: that role could have replaced what it holds).
Oid served_by() {
    StartTransactionCommand();
    const ExtensionObjects* objects = find_extension_objects();
    Oid owner = InvalidOid;
    if (objects != nullptr && schema_is_trusted(*objects))
        owner = objects->owner;
    else if (objects != nullptr)
        ereport(WARNING,
                (errmsg("idempotency worker: not serving database \"%s\": schema \"%s\" does "
                        "not belong to the extension's owner",
                        get_database_name(MyDatabaseId), get_namespace_name(objects->schema))));
    CommitTransactionCommand();
    return owner;
}

void report(int slot, Oid database, bool installed) {
    SharedState* shared = shared_state();
    if (slot < 0 || slot >= kMaxDatabases) return;
    SpinLockAcquire(&shared->mutex);
    if (shared->databases[slot].database == database)
        shared->databases[slot].state =
            installed ? DatabaseState::HasExtension : DatabaseState::NoExtension;
    SpinLockRelease(&shared->mutex);
}

// One batch of one task in its own transaction, so that no lock is held
// longer than a batch. Returns false, having done nothing, when the
// database is wanted by a command that needs the worker gone.
bool run_batch(const MaintenanceTask& task, Oid owner, int batch, std::uint64_t* changed_out) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    // Checked before each batch, so that such a command succeeds; the lock
    // is the batch transaction's, released at its commit.
    if (database_wanted_elsewhere(MyDatabaseId)) {
        CommitTransactionCommand();
        return false;
    }
    if (!task_applies(task)) {
        CommitTransactionCommand();
        *changed_out = 0;
        return true;
    }
    // As the extension's owner, in a security-restricted operation, as
    // autovacuum works as a table's owner: never as the worker's superuser.
    const OwnerScope scope = enter_owner_scope_of(owner);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency worker: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, task.name);
    const std::uint64_t changed = task.run_batch(batch);
    SPI_finish();
    PopActiveSnapshot();
    leave_owner_scope(scope);
    CommitTransactionCommand();
    pgstat_report_stat(false);
    pgstat_report_activity(STATE_IDLE, nullptr);
    *changed_out = changed;
    return true;
}

void sweep() {
    const Oid database = MyDatabaseId;
    int slot = -1;
    std::memcpy(&slot, MyBgworkerEntry->bgw_extra, sizeof slot);
    const Oid owner = served_by();
    report(slot, database, OidIsValid(owner));
    if (!OidIsValid(owner)) return;
    int count = 0;
    const MaintenanceTask* tasks = maintenance_tasks(&count);
    for (int i = 0; i < count; ++i) {
        const int batch = settings::purge_batch;
        std::uint64_t changed = 0;
        do {
            CHECK_FOR_INTERRUPTS();
            if (!run_batch(tasks[i], owner, batch, &changed)) return;
        } while (changed >= static_cast<std::uint64_t>(batch));
    }
}

}  // namespace

}  // namespace idem::pg

extern "C" void idem_worker_main(Datum main_arg) {
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
    idem::pg::guarded_main("idempotency worker", idem::pg::sweep);
    proc_exit(0);
}
