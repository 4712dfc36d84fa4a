#include "relay/observe/log.hpp"

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <sys/time.h>
#include <unistd.h>

namespace idem::relay {

namespace {

std::mutex log_mutex;
std::string log_name = "idem-relay";

void emit(const char* level, const char* format, va_list args) {
    char text[2048];
    vsnprintf(text, sizeof text, format, args);
    const std::string message = log_safe(text);
    struct timeval now;
    gettimeofday(&now, nullptr);
    struct tm local;
    localtime_r(&now.tv_sec, &local);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    std::lock_guard<std::mutex> lock(log_mutex);
    fprintf(stderr, "%s.%03d %s: %s%s\n", stamp, static_cast<int>(now.tv_usec / 1000),
            log_name.c_str(), level, message.c_str());
    fflush(stderr);
}

}  // namespace

std::string log_safe(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if ((u < 0x20 && c != '\t') || u == 0x7f) {
            char escaped[5];
            snprintf(escaped, sizeof escaped, "\\x%02X", u);
            out += escaped;
        } else {
            out += c;
        }
    }
    return out;
}

void set_log_name(const std::string& relay) {
    std::lock_guard<std::mutex> lock(log_mutex);
    log_name = "idem-relay[" + log_safe(relay) + "]";
}

void log_info(const char* format, ...) {
    va_list args;
    va_start(args, format);
    emit("", format, args);
    va_end(args);
}

void log_warning(const char* format, ...) {
    va_list args;
    va_start(args, format);
    emit("WARNING: ", format, args);
    va_end(args);
}

void log_error(const char* format, ...) {
    va_list args;
    va_start(args, format);
    emit("ERROR: ", format, args);
    va_end(args);
}

}  // namespace idem::relay
