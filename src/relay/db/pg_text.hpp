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
// A server message on one line: trailing newlines and spaces dropped, inner
// newlines and tabs as spaces. nullptr is "".
std::string one_line(const char* message);

}  // namespace idem::relay
