#include "core/validate.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "core/cpp_only.hpp"

namespace idem {

void throw_null_argument(const char* name) {
    throw_error(sqlstate::null_value, "%s must not be null", name);
}

void check_optional_name(const char* name, std::size_t bytes, std::size_t max_bytes) {
    if (bytes > max_bytes)
        throw_error(sqlstate::too_long, "%s must be at most %zu bytes long (it has %zu)", name,
                    max_bytes, bytes);
}

void check_name(const char* name, std::size_t bytes, std::size_t max_bytes) {
    if (bytes == 0)
        throw_error(sqlstate::invalid_parameter, "%s must not be empty", name);
    check_optional_name(name, bytes, max_bytes);
}

void check_value_size(const char* name, std::size_t bytes, std::size_t max_bytes) {
    if (bytes > max_bytes)
        throw_error(sqlstate::too_long,
                    "%s must be at most %zu bytes (idempotency.max_value_bytes); it has %zu", name,
                    max_bytes, bytes);
}

void check_positive_interval(const char* name, Micros value, Micros max, const char* max_name) {
    if (value <= 0 || value > max) {
        char limit[64];
        format_duration(max, limit, sizeof limit);
        throw_error(sqlstate::invalid_parameter, "%s must be positive and at most %s (%s)", name,
                    max_name, limit);
    }
}

void check_nonnegative_interval(const char* name, Micros value) {
    if (value < 0 || value > kHundredYears)
        throw_error(sqlstate::invalid_parameter, "%s must be between 0 and 100 years (36000 days)", name);
}

void check_batch(const char* name, std::int64_t value) {
    if (value < 1 || value > kMaxBatch)
        throw_error(sqlstate::invalid_parameter, "%s must be between 1 and %d", name, kMaxBatch);
}

void format_duration(Micros value, char* out, std::size_t out_size) {
    struct Unit { Micros size; const char* one; const char* many; };
    static constexpr Unit units[] = {{kDay, "day", "days"},
                                     {3600 * kSecond, "hour", "hours"},
                                     {60 * kSecond, "min", "min"},
                                     {kSecond, "s", "s"},
                                     {kMillisecond, "ms", "ms"}};
    for (const Unit& unit : units) {
        if (value >= unit.size && value % unit.size == 0) {
            const long long n = value / unit.size;
            std::snprintf(out, out_size, "%lld %s", n, n == 1 ? unit.one : unit.many);
            return;
        }
    }
    std::snprintf(out, out_size, "%lld us", static_cast<long long>(value));
}

}  // namespace idem
