// How long the recent completions of each scope took (library preloaded
// only), per database and scope in shared memory: idem_complete adds each
// completion's time since its claim, and a claim answered in_progress
// reports from it when the holder is expected to be done
// (core/expected_done.hpp). Kept for up to idempotency.max_gauges scopes of
// all databases; a scope beyond them has no estimate, and its in_progress
// answers report the lease left, as without the shared memory.
#pragma once

#include <optional>

#include "core/expected_done.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// A completion of work in `scope` that took `duration` since its claim.
void note_completion(const text* scope, Micros duration);

// The estimate of `scope` in this database, if any completion was noted.
std::optional<DurationEstimate> completion_estimate(const text* scope);

// Shared memory: from the module's request and startup hooks.
Size durations_size();
void request_durations_lock();
void init_durations();

}  // namespace idem::pg
