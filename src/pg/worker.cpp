// A per-database worker: checks that the extension is installed, reports
// that to the launcher, runs each maintenance task in batches of
// idempotency.purge_batch rows, one transaction per batch, and exits.
// An error ends the worker; the launcher starts the next one a naptime later.
#include <cstring>

#include "pg/database_yield.hpp"
#include "pg/maintenance.hpp"
#include "pg/guard.hpp"
#include "pg/settings.hpp"
#include "pg/shared_state.hpp"

extern "C" {
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

bool extension_installed() {
    StartTransactionCommand();
    const bool installed = OidIsValid(get_extension_oid("idempotency", true));
    CommitTransactionCommand();
    return installed;
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
bool run_batch(const MaintenanceTask& task, int batch, std::uint64_t* changed_out) {
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
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency worker: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, task.name);
    const std::uint64_t changed = task.run_batch(batch);
    SPI_finish();
    PopActiveSnapshot();
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
    const bool installed = extension_installed();
    report(slot, database, installed);
    if (!installed) return;
    // Statements are schema-qualified; this also pins operator lookup.
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    int count = 0;
    const MaintenanceTask* tasks = maintenance_tasks(&count);
    for (int i = 0; i < count; ++i) {
        const int batch = settings::purge_batch;
        std::uint64_t changed = 0;
        do {
            CHECK_FOR_INTERRUPTS();
            if (!run_batch(tasks[i], batch, &changed)) return;
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
