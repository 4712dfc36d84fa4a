// Builds the idem_outcome composite that register, claim and complete return.
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct OutcomeFields {
    Outcome outcome = Outcome::Failed;
    Status status = Status::Received;
    bool has_status = true;  // false: no committed state to report (status NULL)
    std::optional<std::int64_t> token;
    std::int32_t attempt = 0;
    bool has_attempt = true;  // false: not known (a tombstone keeps none)
    Datum result = 0;  // jsonb, when has_result
    bool has_result = false;
    Datum error = 0;   // text, when has_error
    bool has_error = false;
    std::optional<Micros> retry_after;
    // Not returned: when the holder of a PROCESSING key claimed it (for the
    // estimate of when it will be done).
    std::optional<Micros> holder_since;
    Datum job_ref = 0;  // text, when has_job_ref
    bool has_job_ref = false;
    // The answer comes from the key's tombstone: its result has passed its
    // retention (0.7.0; an older version's type has no such column).
    bool result_expired = false;
    // The key's finished steps, for a claim that resumes multi-step work
    // (0.7.0; pg/keys/steps_value.hpp).
    Datum steps = 0;  // jsonb, when has_steps
    bool has_steps = false;
};

Datum outcome_datum(FunctionCallInfo fcinfo, const OutcomeFields& fields);

}  // namespace idem::pg
