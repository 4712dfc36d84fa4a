// idempotency.log_transitions: one LOG line per state transition, as
// key=value fields (scope, key, from, to, token, attempt, reason).
// Lines are written when the transition is made; a transaction that later
// rolls back has still logged them. Every transition of a key is reported
// here, logged or not: it is also counted for idem_stats (pg/keys/key_counts.hpp).
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

// `from` is nullptr for a key that did not exist; `to` nullptr for a deletion.
void log_transition(const KeyId& id, std::optional<Status> from,
                    std::optional<Status> to, std::optional<std::int64_t> token,
                    std::int32_t attempt, const char* reason = nullptr);

// A finished step recorded (idem_step): a line of its own under the same
// setting, "idempotency step:", with the key's status, the step's name and
// its place `n`, the token and the attempt. Not a transition: not counted.
void log_step(const KeyId& id, Status status, const text* step, std::int32_t n,
              std::int64_t token, std::int32_t attempt);

}  // namespace idem::pg
