// The states of an idempotency key and the outcomes a call can report.
#pragma once

#include <optional>
#include <string_view>

namespace idem {

enum class Status { Received, Processing, Completed, FailedRetryable, FailedFinal };
inline constexpr int kStatusCount = 5;

enum class Outcome { Registered, Claimed, Completed, InProgress, RetryLater, Failed, Mismatch };

// Labels exactly as in the SQL enum idem_status and the outcome column.
const char* status_label(Status status);
const char* outcome_label(Outcome outcome);
std::optional<Status> parse_status(std::string_view label);

}  // namespace idem
