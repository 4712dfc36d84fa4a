#include "pg/key_counts.hpp"

#include "pg/gauge_recount.hpp"
#include "pg/gauges.hpp"
#include "pg/guard.hpp"
#include "pg/shared_state.hpp"
#include "pg/spi.hpp"

namespace idem::pg {

namespace {

int value_of(Status status) {
    switch (status) {
        case Status::Completed: return kCompletedValue;
        case Status::FailedRetryable: return kFailedRetryableValue;
        case Status::FailedFinal: return kFailedFinalValue;
        case Status::Received:
        case Status::Processing: break;
    }
    return -1;
}

// Without the library preloaded there are no gauges: the counts are read
// from the table, at the cost of a scan.
Statement kCountByScan = {
    "SELECT scope, count(*) FILTER (WHERE status = 'COMPLETED'), "
    "count(*) FILTER (WHERE status = 'FAILED_RETRYABLE'), "
    "count(*) FILTER (WHERE status = 'FAILED_FINAL') "
    "FROM @keys@ WHERE status IN ('COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL') GROUP BY ROLLUP (scope)",
    0, {}, nullptr};

// The rows of key_counts(), and their totals for the row without a scope.
struct Rows {
    ReturnSetInfo* rsinfo;
    std::int64_t totals[kGaugeValues];
};

void put_values(Rows* rows, const char* scope, const std::int64_t values[kGaugeValues]) {
    Datum datums[4] = {scope ? CStringGetTextDatum(scope) : 0,
                       Int64GetDatum(values[kCompletedValue]),
                       Int64GetDatum(values[kFailedRetryableValue]),
                       Int64GetDatum(values[kFailedFinalValue])};
    bool nulls[4] = {scope == nullptr, false, false, false};
    tuplestore_putvalues(rows->rsinfo->setResult, rows->rsinfo->setDesc, datums, nulls);
}

void put_row(const GaugeRow& row, void* context) {
    auto* rows = static_cast<Rows*>(context);
    for (int i = 0; i < kGaugeValues; ++i) rows->totals[i] += row.values[i];
    put_values(rows, row.name, row.values);
}

// idempotency.key_counts(): no row while the counts are unknown.
Datum key_counts_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    connect_spi();
    if (shared_state() == nullptr) {
        const std::uint64_t rows = execute(kCountByScan, Params{});
        for (std::uint64_t row = 0; row < rows; ++row) {
            bool nulls[4] = {false, false, false, false};
            Datum values[4];
            for (int i = 0; i < 4; ++i) values[i] = column(i + 1, &nulls[i], row);
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        }
    } else if (counts_for_view()) {
        Rows rows{rsinfo, {}};
        if (read_gauges(GaugeFamily::Keys, put_row, &rows)) put_values(&rows, nullptr, rows.totals);
    }
    finish_spi();
    return 0;
}

}  // namespace

void count_key_transition(const text* scope, std::optional<Status> from, std::optional<Status> to) {
    if (from == to) return;
    if (from && value_of(*from) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*from), -1);
    if (to && value_of(*to) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*to), 1);
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_key_counts, idem::pg::key_counts_body)
