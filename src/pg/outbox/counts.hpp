// The counts of the outbox behind outbox_lag, per topic (gauges,
// pg/stats/gauges.hpp): events undelivered (pending or in flight), of them those
// handed out at least once (attempts > 0: in flight, or pending again after
// a failure or an expired lease), dead events, and the last delivery. The
// events in flight are counted by the view itself (few, through their
// index): pending = undelivered - handed out, retrying = handed out - in
// flight. Each function counts its change when the transaction commits.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

inline constexpr int kUndeliveredValue = 0;
inline constexpr int kHandedOutValue = 1;
inline constexpr int kDeadValue = 2;

void count_event_enqueued(const text* topic);
// Handed out by outbox_claim as attempt `attempt`: the first makes it handed out.
void count_event_claimed(const text* topic, std::int32_t attempt);
// Released with `attempts` left: none makes it pending as never handed out.
void count_event_released(const text* topic, std::int32_t attempts);
// Event `id`, claimed by this transaction and not written yet, released.
void count_held_event_released(std::int64_t id);

// What the last statement's rows did (SPI_tuptable), read from the topic
// in column `topic_column` (rows without a topic, as the layouts before
// 0.5.0 return, are not counted).
enum class EventsLeft { Delivered, Died, Redriven, Discarded };
void count_result_rows(EventsLeft what, int topic_column, Micros now);
// One event of `topic` did `what` (a direct write's row).
void count_events_left(EventsLeft what, const text* topic, Micros now);
// The rows of a lease expiry: those whose column `dead_column` is true died.
void count_expired_rows(int dead_column, int topic_column);

}  // namespace idem::pg
