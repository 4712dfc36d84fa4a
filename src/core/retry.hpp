// Where a failure and a release are decided: the next state, and when a
// retryable key may be claimed again (exponential backoff with jitter).
#pragma once

#include <cstdint>
#include <optional>

#include "core/key_state.hpp"

namespace idem {

struct RetryPolicy {
    int max_attempts;
    Micros base_delay;
    Micros max_delay;
};

// Backoff after the n-th failed attempt (n >= 1): base * 2^(n-1), capped at
// max_delay, then drawn uniformly from its upper half by `jitter` in [0, 1)
// so that workers that failed together do not retry together.
Micros backoff_delay(std::int32_t attempts, Micros base_delay, Micros max_delay, double jitter);

// Whether work attempted `attempts` times may be attempted again: fewer
// than the cap its claim recorded, or `default_cap` (the current caller's)
// when it recorded none. The same rule for a key's expired lease and an
// outbox event's.
inline bool attempts_left(std::int32_t attempts, std::optional<std::int32_t> recorded_cap,
                          int default_cap) {
    return attempts < recorded_cap.value_or(default_cap);
}

struct FailDecision {
    Status next;                    // FailedRetryable or FailedFinal
    std::optional<Micros> delay;    // until the next claim, for FailedRetryable
};

FailDecision decide_fail(std::int32_t attempts, bool retryable, std::optional<Micros> retry_in,
                         const RetryPolicy& policy, double jitter);

// After a release the attempt is given back: a registered key goes back to
// RECEIVED, any other key is removed, unless it holds finished steps: their
// effects have committed, so it goes back to RECEIVED with them, and the
// next claim resumes after them instead of running them again.
enum class ReleaseAction { BackToReceived, Delete };
ReleaseAction decide_release(const KeyState& key);

}  // namespace idem
