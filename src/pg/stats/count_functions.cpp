// The rows of key_counts() and outbox_counts(), behind idem_stats and
// outbox_lag: per name (a scope, a topic) its values (and its latest time
// `with_latest`), then their totals in a row without a name; no row while
// the counts are unknown. Read from the gauges (pg/stats/gauges.hpp) where
// they are kept; counted from the table where they are not (the library
// not preloaded, or a database whose names did not fit in shared memory).
// From 0.7.0 each row also says which, in its last column counted_by:
// 'commits' or 'scan'.
#include <algorithm>

#include "pg/access/spi.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/stats/count_statements.hpp"
#include "pg/stats/recount.hpp"

extern "C" {
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"
}

namespace idem::pg {

namespace {

// A set-returning function's rows, and the totals of the gauges put so far.
struct Rows {
    ReturnSetInfo* rsinfo;
    GaugeRow totals;
    int columns;    // those of 0.6.0: the name, the values (and the latest time)
    bool says_how;  // the function has counted_by after them (0.7.0)
};

void put(Rows* rows, Datum* values, bool* nulls, const char* counted_by) {
    if (rows->says_how) {
        values[rows->columns] = CStringGetTextDatum(counted_by);
        nulls[rows->columns] = false;
    }
    tuplestore_putvalues(rows->rsinfo->setResult, rows->rsinfo->setDesc, values, nulls);
}

void put_gauge(Rows* rows, const GaugeRow& row) {
    Datum values[kGaugeValues + 3];
    bool nulls[kGaugeValues + 3] = {};
    values[0] = row.name != nullptr ? CStringGetTextDatum(row.name) : 0;
    nulls[0] = row.name == nullptr;
    for (int i = 0; i < kGaugeValues; ++i) values[i + 1] = Int64GetDatum(row.values[i]);
    // Keys have no latest time: the counted_by column (if any) takes its place.
    values[kGaugeValues + 1] = TimestampTzGetDatum(row.latest);
    nulls[kGaugeValues + 1] = row.latest == 0;
    put(rows, values, nulls, "commits");
}

void add_gauge(const GaugeRow& row, void* context) {
    auto* rows = static_cast<Rows*>(context);
    for (int i = 0; i < kGaugeValues; ++i) rows->totals.values[i] += row.values[i];
    rows->totals.latest = std::max(rows->totals.latest, row.latest);
    put_gauge(rows, row);
}

// The table's rows as count_statement() counts them, totals included.
void put_counted(Rows* rows, GaugeFamily family) {
    const std::uint64_t found = execute(count_statement(family), Params{});
    for (std::uint64_t row = 0; row < found; ++row) {
        Datum values[kGaugeValues + 3];
        bool nulls[kGaugeValues + 3];
        for (int i = 0; i < rows->columns; ++i) values[i] = column(i + 1, &nulls[i], row);
        put(rows, values, nulls, "scan");
    }
}

Datum counts_rows(FunctionCallInfo fcinfo, GaugeFamily family, bool with_latest) {
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const int columns = kGaugeValues + (with_latest ? 2 : 1);
    Rows rows{rsinfo, GaugeRow{nullptr, {}, 0}, columns, rsinfo->setDesc->natts > columns};
    connect_spi();
    GaugeSource source = !shared_memory_ready() ? GaugeSource::Tables : counts_for_view();
    // Kept when asked, they may have overflowed by the read: then counted.
    if (source == GaugeSource::Kept) source = read_gauges(family, add_gauge, &rows);
    if (source == GaugeSource::Kept) put_gauge(&rows, rows.totals);
    if (source == GaugeSource::Tables) put_counted(&rows, family);
    finish_spi();
    return 0;
}

// idempotency.key_counts(): no row while the counts are unknown.
Datum key_counts_body(FunctionCallInfo fcinfo) {
    return counts_rows(fcinfo, GaugeFamily::Keys, false);
}

// idempotency.outbox_counts(): no row while the counts are unknown.
Datum outbox_counts_body(FunctionCallInfo fcinfo) {
    return counts_rows(fcinfo, GaugeFamily::Outbox, true);
}

}  // namespace

}  // namespace idem::pg

// 0.6.0's key_counts(); 0.7.0's, with counted_by, has a symbol of its own,
// which a library older than 0.7.0 lacks: an update or install run while
// the server still has the old library preloaded fails at once, instead of
// the old code filling a row of the new shape.
IDEM_SQL_FUNCTION(idem_key_counts, idem::pg::key_counts_body)
IDEM_SQL_FUNCTION(idem_key_counts_with_source, idem::pg::key_counts_body)

// As key_counts(): 0.7.0's outbox_counts() has a symbol of its own.
IDEM_SQL_FUNCTION(idem_outbox_counts, idem::pg::outbox_counts_body)
IDEM_SQL_FUNCTION(idem_outbox_counts_with_source, idem::pg::outbox_counts_body)

