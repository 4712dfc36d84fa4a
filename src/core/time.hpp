// Times and durations in the core are plain microsecond counts, the unit
// PostgreSQL uses for timestamptz and interval.
#pragma once

#include <cstdint>

namespace idem {

using Micros = std::int64_t;

inline constexpr Micros kMillisecond = 1000;
inline constexpr Micros kSecond = 1000 * kMillisecond;
inline constexpr Micros kDay = 86400 * kSecond;
// PostgreSQL's interval arithmetic counts a month as 30 days.
inline constexpr Micros kHundredYears = 100 * 12 * 30 * kDay;

}  // namespace idem
