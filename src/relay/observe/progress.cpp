#include "relay/observe/progress.hpp"

#include <chrono>
#include <cstdio>
#include <string>

#include "relay/observe/log.hpp"

namespace idem::relay {

void ProgressLine::print(Stats& stats, Clock::time_point now, bool final_line) {
    std::string lag = "n/a";
    if (stats.lag_known) {
        char text[32];
        snprintf(text, sizeof text, "%.3fs", stats.lag_seconds.load());
        lag = text;
    }
    const std::uint64_t delivered = stats.delivered.load();
    const double interval = std::chrono::duration<double>(now - last_).count();
    const double rate =
        interval > 0 ? static_cast<double>(delivered - last_delivered_) / interval : 0.0;
    log_info("%sdelivered=%llu retried=%llu dead=%llu in_flight=%lld lag=%s delay_max=%.3fs "
             "rate=%.1f/s db=%s waiting_retry=%lld released=%llu not_attempted=%llu "
             "duplicates=%llu",
             final_line ? "stopped: " : "", static_cast<unsigned long long>(delivered),
             static_cast<unsigned long long>(stats.retried.load()),
             static_cast<unsigned long long>(stats.dead.load()),
             static_cast<long long>(stats.in_flight.load()), lag.c_str(),
             stats.delay_max.exchange(0), rate, stats.connected() ? "up" : "down",
             static_cast<long long>(stats.waiting_retry.load()),
             static_cast<unsigned long long>(stats.released.load()),
             static_cast<unsigned long long>(stats.not_attempted.load()),
             static_cast<unsigned long long>(stats.duplicates.load()));
    last_delivered_ = delivered;
    last_ = now;
}

}  // namespace idem::relay
