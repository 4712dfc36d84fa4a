#include "relay/log.hpp"

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
    char message[2048];
    vsnprintf(message, sizeof message, format, args);
    struct timeval now;
    gettimeofday(&now, nullptr);
    struct tm local;
    localtime_r(&now.tv_sec, &local);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    std::lock_guard<std::mutex> lock(log_mutex);
    fprintf(stderr, "%s.%03d %s: %s%s\n", stamp, static_cast<int>(now.tv_usec / 1000),
            log_name.c_str(), level, message);
    fflush(stderr);
}

}  // namespace

void set_log_name(const std::string& relay) {
    std::lock_guard<std::mutex> lock(log_mutex);
    log_name = "idem-relay[" + relay + "]";
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
