// The finished steps of a key as its `steps` column holds them, and as
// idem_claim and idem_get return them: a jsonb object with a member per
// step, {"reserve": {"n": 1, "attempt": 1, "result": ...}, ...}: `n` is the
// step's place in the order the steps were recorded, `attempt` the claim
// that recorded it, `result` what it returned (JSON null for none).
//
// Why a column of the key's row and not a table of their own: a step is
// recorded by one UPDATE of a row the holder's calls change anyway, with no
// index following the column (a HOT update, like a heartbeat); the steps
// are read with the key by the claim that resumes; they are deleted with
// the key by the purge and by a release, and dumped with it by pg_dump,
// with no statement of their own. The cost is that each step rewrites the
// key's steps whole, which idempotency.max_steps and
// idempotency.max_step_bytes bound.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// The number of steps recorded in `steps`.
int steps_count(Datum steps);

// Whether `steps` holds a step named `name`.
bool step_recorded(Datum steps, const text* name);

// The steps with one more, `name`, at place `n`, recorded by attempt
// `attempt`; `steps` 0 when the key has none yet, `result` 0 for NULL.
Datum steps_with(Datum steps, const text* name, std::int32_t n, std::int32_t attempt,
                 Datum result);

}  // namespace idem::pg
