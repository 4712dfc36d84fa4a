// Where the record of a finished step of multi-step work is decided: what a
// step's name may be, and whether the key may take one more step. The
// PostgreSQL layer (pg/keys/step_functions.cpp) reads the key and raises
// what is decided here.
#pragma once

#include <cstddef>

namespace idem {

// A step's name is part of the key derived for the step's external call
// (idem_step_key), which providers receive in a header: 1 to 63 bytes of
// ASCII letters, digits and `_ . : -`.
inline constexpr std::size_t kMaxStepNameBytes = 63;

// Throws 22023 for an empty name or one with another character, 22001 for
// one longer than kMaxStepNameBytes.
void check_step_name(const char* name, std::size_t bytes);

// Throws 22001 for a step's result larger than `max_bytes`
// (idempotency.max_step_bytes), checked with the arguments.
void check_step_result_size(const char* step, std::size_t bytes, std::size_t max_bytes);

enum class StepVerdict {
    Record,     // the step is recorded after the ones before it
    Duplicate,  // a step of that name is already recorded (IK004)
    TooMany,    // the key holds max_steps steps already (54000)
};

// `recorded`: the steps the key holds; `duplicate`: one of them has the
// name; `max_steps`: idempotency.max_steps.
StepVerdict decide_step(int recorded, bool duplicate, int max_steps);

// The SQLSTATE of a verdict that refuses the step.
const char* step_sqlstate(StepVerdict verdict);

}  // namespace idem
