// How long a retryable failure waits: the extension's backoff, or longer when
// the sink asked for it (Retry-After), never longer than the backoff's cap.
#pragma once

#include <cstdint>
#include <optional>

#include "relay/options.hpp"

namespace idem::relay {

// idempotency.retry_base_delay and idempotency.retry_max_delay as the
// relay's session sees them (the extension's defaults until read).
struct RetrySettings {
    Millis base{1000};
    Millis max{3600 * 1000};
};

// The retry_in to pass to outbox_nack for a failure of this attempt (1 for
// the first): empty without Retry-After (the extension's own backoff, with
// its jitter, applies); otherwise Retry-After, raised to the backoff of the
// attempt (base * 2^(attempt-1)) and capped at the backoff's maximum, so
// that "Retry-After: 0" or a date in the past cannot burn the attempts and a
// far-future one cannot park the event for years.
std::optional<std::int64_t> retry_in_ms(const std::optional<std::int64_t>& retry_after_ms,
                                        int attempt, const RetrySettings& settings);

}  // namespace idem::relay
