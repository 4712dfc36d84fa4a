#include "core/steps.hpp"

#include "core/error.hpp"
#include "core/cpp_only.hpp"

namespace idem {

namespace {

bool allowed_in_step_name(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == ':' || c == '-';
}

}  // namespace

void check_step_name(const char* name, std::size_t bytes) {
    if (bytes == 0) throw_error(sqlstate::invalid_parameter, "step must not be empty");
    if (bytes > kMaxStepNameBytes)
        throw_error(sqlstate::too_long, "step must be at most %zu bytes long (it has %zu)",
                    kMaxStepNameBytes, bytes);
    for (std::size_t i = 0; i < bytes; ++i)
        if (!allowed_in_step_name(name[i]))
            throw_error(sqlstate::invalid_parameter,
                        "step must hold only ASCII letters, digits and _ . : - (byte %zu is not "
                        "one of them)",
                        i + 1);
}

void check_step_result_size(const char* step, std::size_t bytes, std::size_t max_bytes) {
    if (bytes > max_bytes)
        throw_error(sqlstate::too_long,
                    "the result of step \"%s\" must be at most %zu bytes "
                    "(idempotency.max_step_bytes); it has %zu",
                    step, max_bytes, bytes);
}

StepVerdict decide_step(int recorded, bool duplicate, int max_steps) {
    // A repeated name is reported first: it is the caller's logic, not a limit.
    if (duplicate) return StepVerdict::Duplicate;
    if (recorded >= max_steps) return StepVerdict::TooMany;
    return StepVerdict::Record;
}

const char* step_sqlstate(StepVerdict verdict) {
    switch (verdict) {
        case StepVerdict::Duplicate: return sqlstate::step_recorded;
        case StepVerdict::TooMany: return sqlstate::limit_exceeded;
        case StepVerdict::Record: break;
    }
    return sqlstate::internal;
}

}  // namespace idem
