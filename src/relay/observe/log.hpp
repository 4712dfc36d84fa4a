// Diagnostics of idem-relay: one line per message on stderr, safe to call
// from any thread.
#pragma once

#include <string>
#include <string_view>

namespace idem::relay {

// The relay's name, shown in every line ("idem-relay[NAME]: ...").
void set_log_name(const std::string& relay);

// The text with CR, LF and other control bytes but tab written as \n, \r,
// \xNN: a topic, key or error text can never start a line of its own.
std::string log_safe(std::string_view text);

void log_info(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_warning(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace idem::relay
