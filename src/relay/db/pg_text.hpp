// The text forms the relay passes to libpq and reads from it: array
// literals for parameters, and server messages made into one log line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace idem::relay {

// A text[] literal: every item quoted, '"' and '\' escaped.
std::string array_literal(const std::vector<std::string>& items);
// An int8[] literal.
std::string id_array(const std::vector<std::int64_t>& ids);
// A decimal number as the server writes it (extract's epoch seconds, a
// numeric: a float8 would follow the session's extra_float_digits, which
// at -15 writes "2e+09"); 0 when it is not one. Read without strtod's
// locale, which cost the relay as much per event as building its line of
// output.
double parse_double(const char* text);
// A server message on one line: trailing newlines and spaces dropped, inner
// newlines and tabs as spaces. nullptr is "".
std::string one_line(const char* message);

}  // namespace idem::relay
