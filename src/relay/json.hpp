// The little JSON the relay needs: writing strings, and reading the members
// of an event's headers object (jsonb text from the database).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::relay {

// Appends s as a JSON string literal (quotes included).
void append_json_string(std::string& out, std::string_view s);

// The members of a JSON object, in order: the name decoded, the value decoded
// when it is a string, otherwise its JSON text as written. False when text is
// not a JSON object.
using JsonMembers = std::vector<std::pair<std::string, std::string>>;
bool parse_json_object(std::string_view text, JsonMembers* members);

}  // namespace idem::relay
