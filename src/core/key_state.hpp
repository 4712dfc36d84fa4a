// What the decisions need to know about a stored key: a plain snapshot of
// its row, read by the PostgreSQL layer.
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.hpp"
#include "core/time.hpp"

namespace idem {

struct KeyState {
    Status status = Status::Received;
    std::optional<std::int64_t> token;      // the current fencing token
    std::int32_t attempts = 0;              // granted claims so far
    std::optional<Micros> lease_until;
    std::optional<Micros> next_attempt_at;
    bool lease_expired = false;  // the current token's lease ran out (not the holder's own doing)
    bool registered = false;     // created by idem_register: release returns it to RECEIVED
    std::optional<std::int32_t> max_attempts;  // the attempt cap its claim recorded
    bool has_steps = false;      // finished steps of multi-step work are recorded (0.7.0)
};

}  // namespace idem
