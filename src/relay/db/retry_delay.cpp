#include "relay/db/retry_delay.hpp"

#include <algorithm>

namespace idem::relay {

std::optional<std::int64_t> retry_in_ms(const std::optional<std::int64_t>& retry_after_ms,
                                        int attempt, const RetrySettings& settings) {
    if (!retry_after_ms) return std::nullopt;
    const std::int64_t cap = std::max<std::int64_t>(0, settings.max.count());
    // base * 2^(attempt-1), stopping at the cap before it could overflow.
    std::int64_t backoff = std::max<std::int64_t>(0, settings.base.count());
    for (int i = 1; i < attempt && backoff < cap; ++i) backoff *= 2;
    backoff = std::min(backoff, cap);
    return std::min(std::max(*retry_after_ms, backoff), cap);
}

}  // namespace idem::relay
