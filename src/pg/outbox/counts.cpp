#include "pg/outbox/counts.hpp"


#include "pg/access/spi.hpp"
#include "pg/stats/gauges.hpp"

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

void count_events_left(EventsLeft what, const text* topic, Micros now) {
    count_one(what, topic, now);
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
