#include "pg/outbox_counts.hpp"

#include <algorithm>

#include "pg/gauge_recount.hpp"
#include "pg/gauges.hpp"
#include "pg/guard.hpp"
#include "pg/shared_state.hpp"
#include "pg/spi.hpp"

namespace idem::pg {

namespace {

void add(const text* topic, int value, std::int64_t delta) {
    gauge_add_on_commit(GaugeFamily::Outbox, topic, value, delta);
}

void count_one(EventsLeft what, const text* topic, Micros now) {
    switch (what) {
        case EventsLeft::Delivered:
            add(topic, kUndeliveredValue, -1);
            add(topic, kHandedOutValue, -1);
            gauge_latest_on_commit(GaugeFamily::Outbox, topic, now);
            break;
        case EventsLeft::Died:
            add(topic, kUndeliveredValue, -1);
            add(topic, kHandedOutValue, -1);
            add(topic, kDeadValue, 1);
            break;
        case EventsLeft::Redriven:  // pending again, its attempts counted from zero
            add(topic, kDeadValue, -1);
            add(topic, kUndeliveredValue, 1);
            break;
        case EventsLeft::Discarded:
            add(topic, kDeadValue, -1);
            break;
    }
}

const text* topic_in(int column_number, std::uint64_t row) {
    bool isnull = false;
    const Datum topic = column(column_number, &isnull, row);
    return isnull ? nullptr : DatumGetTextPP(topic);
}

Statement kHeldEvent = {"SELECT topic, attempts FROM @outbox@ WHERE id = $1", 1, {INT8OID},
                        nullptr};

// Without the library preloaded there are no gauges: read from the table.
Statement kCountByScan = {
    "SELECT topic, count(*) FILTER (WHERE state IN ('pending', 'in_flight')), "
    "count(*) FILTER (WHERE state IN ('pending', 'in_flight') AND attempts > 0), "
    "count(*) FILTER (WHERE state = 'dead'), max(delivered_at) "
    "FROM @outbox@ GROUP BY ROLLUP (topic)",
    0, {}, nullptr};

// The rows of outbox_counts(), and their totals for the row without a topic.
struct Rows {
    ReturnSetInfo* rsinfo;
    GaugeRow totals;
};

void put_values(Rows* rows, const GaugeRow& row) {
    Datum values[5] = {row.name ? CStringGetTextDatum(row.name) : 0,
                       Int64GetDatum(row.values[kUndeliveredValue]),
                       Int64GetDatum(row.values[kHandedOutValue]),
                       Int64GetDatum(row.values[kDeadValue]), TimestampTzGetDatum(row.latest)};
    bool nulls[5] = {row.name == nullptr, false, false, false, row.latest == 0};
    tuplestore_putvalues(rows->rsinfo->setResult, rows->rsinfo->setDesc, values, nulls);
}

void put_row(const GaugeRow& row, void* context) {
    auto* rows = static_cast<Rows*>(context);
    for (int i = 0; i < kGaugeValues; ++i) rows->totals.values[i] += row.values[i];
    rows->totals.latest = std::max(rows->totals.latest, row.latest);
    put_values(rows, row);
}

// idempotency.outbox_counts(): no row while the counts are unknown.
Datum outbox_counts_body(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    connect_spi();
    if (shared_state() == nullptr) {
        const std::uint64_t rows = execute(kCountByScan, Params{});
        for (std::uint64_t row = 0; row < rows; ++row) {
            bool nulls[5] = {false, false, false, false, false};
            Datum values[5];
            for (int i = 0; i < 5; ++i) values[i] = column(i + 1, &nulls[i], row);
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        }
    } else if (counts_for_view()) {
        Rows rows{rsinfo, GaugeRow{nullptr, {}, 0}};
        if (read_gauges(GaugeFamily::Outbox, put_row, &rows)) put_values(&rows, rows.totals);
    }
    finish_spi();
    return 0;
}

}  // namespace

void count_event_enqueued(const text* topic) { add(topic, kUndeliveredValue, 1); }

void count_event_claimed(const text* topic, std::int32_t attempt) {
    if (attempt == 1) add(topic, kHandedOutValue, 1);
}

void count_event_released(const text* topic, std::int32_t attempts) {
    if (attempts == 0) add(topic, kHandedOutValue, -1);
}

void count_held_event_released(std::int64_t id) {
    Params params;
    params.add_int8(id);
    if (execute(kHeldEvent, params, 1) == 0) return;
    bool isnull = false;
    // The row still holds the attempts from before the claim.
    count_event_released(topic_in(1, 0), DatumGetInt32(column(2, &isnull)));
}

void count_result_rows(EventsLeft what, int topic_column, Micros now) {
    for (std::uint64_t row = 0; row < SPI_processed; ++row)
        if (const text* topic = topic_in(topic_column, row)) count_one(what, topic, now);
}

void count_expired_rows(int dead_column, int topic_column) {
    for (std::uint64_t row = 0; row < SPI_processed; ++row) {
        bool isnull = false;
        const text* topic = topic_in(topic_column, row);
        if (topic != nullptr && DatumGetBool(column(dead_column, &isnull, row)))
            count_one(EventsLeft::Died, topic, 0);
    }
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_outbox_counts, idem::pg::outbox_counts_body)
