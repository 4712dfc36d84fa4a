// The headers of an HTTP delivery: the relay's own (Idempotency-Key,
// X-Outbox-*) and the event's, which may not pose as them.
#pragma once

#include <string>
#include <string_view>

namespace idem::relay {

// A value of the relay's own headers, reversibly encoded: '%', space,
// control bytes and bytes outside ASCII become %XX (upper-case hex), every
// other byte is itself; percent-decoding gives back the original bytes, so
// two different keys never reach a receiver as the same header.
std::string encode_header_value(std::string_view value);

// A header name the relay sets itself or that HTTP framing owns (compared
// without case, with '_' taken as '-', as CGI and WSGI servers fold them).
bool is_reserved_header(std::string_view name);

// An RFC 9110 token.
bool is_header_name(std::string_view name);

// No control byte but horizontal tab: nothing that could end the header or
// confuse a parser.
bool is_header_value(std::string_view value);

}  // namespace idem::relay
