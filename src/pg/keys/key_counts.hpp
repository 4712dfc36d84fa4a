// The counts of finished keys behind idem_stats, per scope: COMPLETED,
// FAILED_RETRYABLE and FAILED_FINAL (gauges, pg/stats/gauges.hpp). The live
// states are counted by the view itself through the live keys' index.
#pragma once

#include <optional>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// The value of each finished status among a scope's gauge values.
inline constexpr int kCompletedValue = 0;
inline constexpr int kFailedRetryableValue = 1;
inline constexpr int kFailedFinalValue = 2;

// A key of `scope` went from `from` to `to` (nullopt: it did not exist, or
// was deleted): counted when the transaction commits. Every transition is
// reported here through log_transition (pg/keys/transition_log.hpp).
void count_key_transition(const text* scope, std::optional<Status> from, std::optional<Status> to);

}  // namespace idem::pg
