// The SQL functions of the housekeeping: idem_maintenance() runs every
// task at once in the caller's session, and idempotency.request_sweep()
// asks a worker to come (runtime/tasks.hpp).
#include "core/error.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/subscription_target.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/runtime/tasks.hpp"

extern "C" {
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/tuplestore.h"
}

namespace idem::pg {

namespace {

// idem_maintenance(): every task until a batch comes back short.
Datum maintenance_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const int batch = settings::purge_batch;
    // The publisher's workers do this work for the subscription's tables.
    if (const char* subscription = feeding_subscription())
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idem_maintenance(): the extension's tables in this database are "
                               "written by subscription \"%s\"",
                               subscription),
                        errhint("Run it where the subscription's publisher is; here it changes "
                                "nothing until the subscription is dropped.")));

    connect_spi();
    // As in the worker, the sweeps find rows through their indexes; the
    // caller's setting is back when the function returns.
    const int nest_level = NewGUCNestLevel();
    for (const char* scan : kFullScans)
        (void)set_config_option(scan, "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                                false);
    // What the workers would do first when the counts are unknown.
    (void)kBackgroundWork.recount_if_unknown(true);
    int count = 0;
    const MaintenanceTask* tasks = maintenance_tasks(&count);
    for (int i = 0; i < count; ++i) {
        const MaintenanceTask& task = tasks[i];
        if (!task_applies(task)) continue;
        std::uint64_t total = 0;
        for (;;) {
            const std::uint64_t changed = task.run_batch(batch);
            total += changed;
            if (changed < static_cast<std::uint64_t>(batch)) break;
            CHECK_FOR_INTERRUPTS();
        }
        Datum values[2] = {CStringGetTextDatum(task.name), Int64GetDatum(static_cast<int64>(total))};
        bool nulls[2] = {false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    AtEOXact_GUC(true, nest_level);
    finish_spi();
    return 0;
}

// idempotency.request_sweep(): a worker sweeps this database soon, whatever
// the due times say (after rows were written behind the functions' back).
Datum request_sweep_body(FunctionCallInfo) {
    require_shared_memory("idempotency.request_sweep()");
    // Rows written behind the functions are counted again, too.
    kBackgroundWork.forget_counts(MyDatabaseId);
    if (!request_sweep(MyDatabaseId))
        throw Error("53000",
                    "the launcher's table of databases is full (idempotency.max_databases)");
    PG_RETURN_VOID();
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_maintenance, idem::pg::maintenance_body)
IDEM_SQL_FUNCTION(idem_request_sweep, idem::pg::request_sweep_body)
