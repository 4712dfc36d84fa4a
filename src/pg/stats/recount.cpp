#include "pg/stats/recount.hpp"

#include <algorithm>
#include <initializer_list>

#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/subscription_target.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/stats/count_statements.hpp"
#include "pg/stats/gauges.hpp"

extern "C" {
#include "access/table.h"
#include "access/xlog.h"
#include "storage/bufmgr.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

Statement kRepairActive = {
    "UPDATE @keys@ SET active_since = COALESCE(claimed_at, updated_at) "
    "WHERE active_since IS NULL AND status IN ('RECEIVED', 'PROCESSING')",
    0, {}, nullptr};

Statement kPreparedHere = {
    "SELECT transaction FROM pg_catalog.pg_prepared_xact() WHERE dbid = $1", 1, {OIDOID},
    nullptr};

void store_rows(GaugeFamily family, std::uint64_t rows, bool has_latest) {
    // One row is the totals' (ROLLUP has it even without rows).
    recount_expect(rows > 0 ? static_cast<long>(rows - 1) : 0);
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const Datum named = column(1, &isnull, row);
        if (isnull) continue;
        const text* name = DatumGetTextPP(named);
        std::int64_t values[kGaugeValues];
        for (int i = 0; i < kGaugeValues; ++i) values[i] = column_int8(i + 2, row).value_or(0);
        recount_row(family, name, values,
                    has_latest ? column_timestamp(kGaugeValues + 2, row) : std::nullopt);
    }
}

}  // namespace

bool gauges_apply() {
    const ExtensionObjects* objects = installed_extension_objects();
    return objects != nullptr && OidIsValid(objects->keys) && OidIsValid(objects->outbox) &&
           get_attnum(objects->keys, "active_since") != InvalidAttrNumber;
}

bool recount_if_unknown(bool repair) {
    if (!gauges_apply() || RecoveryInProgress() || feeding_subscription() != nullptr) return false;
    if (gauge_source() != GaugeSource::Unknown) return true;
    // A count reads every row: with the scans the sweeps turn off.
    const int nest_level = NewGUCNestLevel();
    for (const char* scan : {"enable_seqscan", "enable_bitmapscan"})
        (void)set_config_option(scan, "on", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                                false);
    if (repair) execute(kRepairActive, Params{});
    const std::uint64_t prepared_count =
        execute(kPreparedHere, Params{}.add(ObjectIdGetDatum(MyDatabaseId)));
    auto* prepared = static_cast<TransactionId*>(
        palloc(sizeof(TransactionId) * std::max<std::uint64_t>(prepared_count, 1)));
    for (std::uint64_t row = 0; row < prepared_count; ++row) {
        bool isnull = false;
        prepared[row] = DatumGetTransactionId(column(1, &isnull, row));
    }
    Snapshot snapshot = begin_recount(prepared, static_cast<int>(prepared_count));
    if (snapshot != nullptr) {
        for (GaugeFamily family : {GaugeFamily::Keys, GaugeFamily::Outbox})
            store_rows(family, execute_with_snapshot(count_statement(family), Params{}, snapshot),
                       family == GaugeFamily::Outbox);
        UnregisterSnapshot(snapshot);
        end_recount();
    }
    AtEOXact_GUC(true, nest_level);
    return snapshot != nullptr;
}

namespace {

// Tables this small are recounted by the read that finds the counts unknown
// (a new install, a small database): it costs about as much as one read of
// the old views. Larger ones are left to a worker.
constexpr BlockNumber kRecountInlineBlocks = 1024;

bool tables_are_small() {
    const ExtensionObjects& objects = extension_objects();
    BlockNumber blocks = 0;
    for (Oid table : {objects.keys, objects.outbox}) {
        Relation relation = table_open(table, AccessShareLock);
        blocks += RelationGetNumberOfBlocks(relation);
        table_close(relation, AccessShareLock);
    }
    return blocks <= kRecountInlineBlocks;
}

}  // namespace

GaugeSource counts_for_view() {
    if (RecoveryInProgress()) return GaugeSource::Unknown;
    // A subscription writes the tables behind the functions: each read
    // counts them, and the kept counts are recounted once it is gone.
    if (feeding_subscription() != nullptr && gauges_apply()) {
        forget_gauges(MyDatabaseId);
        return GaugeSource::Tables;
    }
    const GaugeSource source = gauge_source();
    if (source != GaugeSource::Unknown || !gauges_apply()) return source;
    // A worker recounts soon when one will come; otherwise this read does.
    if (settings::worker_enabled && !tables_are_small() && request_sweep(MyDatabaseId))
        return GaugeSource::Unknown;
    (void)recount_if_unknown(false);
    return gauge_source();
}

}  // namespace idem::pg
