// What an HTTP answer means for an outbox event: 2xx acks; 408, 409, 425,
// 429 and 5xx retry (honouring Retry-After); any other 4xx is final.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "relay/event.hpp"

namespace idem::relay {

// Retry-After as milliseconds: delta-seconds, or an HTTP date relative to
// now. Empty when absent or unreadable; a date in the past is 0.
std::optional<std::int64_t> parse_retry_after(std::string_view value, std::time_t now);

// The outcome of a response with this status. body is the start of the
// response body, quoted in the error.
Outcome classify_response(long status, const std::optional<std::int64_t>& retry_after_ms,
                          std::string_view body);

// Printable ASCII only, at most limit bytes (for error texts).
std::string printable(std::string_view text, std::size_t limit);

}  // namespace idem::relay
