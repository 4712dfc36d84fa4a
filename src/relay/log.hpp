// Diagnostics of idem-relay: one line per message on stderr, safe to call
// from any thread.
#pragma once

#include <string>

namespace idem::relay {

// The relay's name, shown in every line ("idem-relay[NAME]: ...").
void set_log_name(const std::string& relay);

void log_info(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_warning(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace idem::relay
