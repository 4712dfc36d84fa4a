#include "core/retry.hpp"

#include <algorithm>
#include "core/cpp_only.hpp"

namespace idem {

Micros backoff_delay(std::int32_t attempts, Micros base_delay, Micros max_delay, double jitter) {
    if (base_delay <= 0 || max_delay <= 0) return 0;
    Micros delay = base_delay;
    for (std::int32_t n = 1; n < attempts && delay < max_delay; ++n)
        delay = delay > max_delay / 2 ? max_delay : delay * 2;
    delay = std::min(delay, max_delay);
    jitter = std::clamp(jitter, 0.0, 1.0);
    const Micros half = delay / 2;
    // Above 2^53 the double rounds and could land past the cap: clamp.
    return std::min(delay, half + static_cast<Micros>(static_cast<double>(delay - half) * jitter));
}

FailDecision decide_fail(std::int32_t attempts, bool retryable, std::optional<Micros> retry_in,
                         const RetryPolicy& policy, double jitter) {
    if (!retryable || attempts >= policy.max_attempts)
        return FailDecision{Status::FailedFinal, std::nullopt};
    const Micros delay =
        retry_in ? *retry_in
                 : backoff_delay(attempts, policy.base_delay, policy.max_delay, jitter);
    return FailDecision{Status::FailedRetryable, delay};
}

ReleaseAction decide_release(const KeyState& key) {
    return key.registered || key.has_steps ? ReleaseAction::BackToReceived : ReleaseAction::Delete;
}

}  // namespace idem
