// Where arguments are checked: the limits every function shares.
// Each check throws idem::Error with the documented SQLSTATE, and the
// message names the argument and the limit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/time.hpp"

namespace idem {

inline constexpr std::size_t kMaxNameBytes = 255;   // key, topic, resource, ...
inline constexpr std::size_t kMaxScopeBytes = 63;
inline constexpr int kMaxBatch = 10000;

[[noreturn]] void throw_null_argument(const char* name);

// A non-empty name of at most `max_bytes` bytes.
void check_name(const char* name, std::size_t bytes, std::size_t max_bytes = kMaxNameBytes);
// An optional name: may be empty, limited in length.
void check_optional_name(const char* name, std::size_t bytes,
                         std::size_t max_bytes = kMaxNameBytes);
// A stored value (result, payload, error) of at most `max_bytes`.
void check_value_size(const char* name, std::size_t bytes, std::size_t max_bytes);
// lease, extend, ttl, wait: positive and at most `max` (named `max_name`).
void check_positive_interval(const char* name, Micros value, Micros max, const char* max_name);
// retain, retry_in: zero or positive, at most 100 years.
void check_nonnegative_interval(const char* name, Micros value);
void check_batch(const char* name, std::int64_t value);

// Words for a duration in messages, such as "1 day" or "30 s".
void format_duration(Micros value, char* out, std::size_t out_size);

}  // namespace idem
