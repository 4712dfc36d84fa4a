#include "relay/loop/claim_sizer.hpp"

#include <algorithm>
#include <cmath>

namespace idem::relay {

namespace {

// Weight of the newest sample in the moving averages.
constexpr double kWeight = 0.2;

void average_in(double* average, double sample) {
    *average = *average == 0 ? sample : *average + kWeight * (sample - *average);
}

}  // namespace

ClaimSizer::ClaimSizer(const Options& options, Millis longest_delivery)
    : batch_(options.batch),
      parallel_(options.parallel),
      window_seconds_(std::chrono::duration<double>(options.lease - longest_delivery).count()),
      max_bytes_(options.max_in_flight_bytes) {}

void ClaimSizer::delivered(double seconds) {
    if (seconds >= 0) average_in(&seconds_, std::max(seconds, 1e-6));
}

void ClaimSizer::claimed(std::int64_t bytes) {
    if (bytes >= 0) average_in(&bytes_, static_cast<double>(std::max<std::int64_t>(bytes, 1)));
}

int ClaimSizer::limit() const {
    if (seconds_ == 0 || window_seconds_ <= 0) return batch_;
    // Event k of a claim starts after about k / parallel deliveries.
    const double fit = std::ceil(parallel_ * window_seconds_ / seconds_);
    return static_cast<int>(std::clamp(fit, 1.0, static_cast<double>(batch_)));
}

int ClaimSizer::want(std::int64_t in_flight, std::int64_t in_flight_bytes) const {
    const int most = limit();
    // Claim when at most half of it is in flight, and only as much as fits.
    if (in_flight > most / 2 || in_flight_bytes > max_bytes_ / 2) return 0;
    std::int64_t count = most - in_flight;
    if (bytes_ > 0) {
        const double room = static_cast<double>(max_bytes_ - in_flight_bytes) / bytes_;
        count = std::min<std::int64_t>(count, std::max<std::int64_t>(1, static_cast<std::int64_t>(room)));
    }
    return static_cast<int>(std::max<std::int64_t>(count, 0));
}

}  // namespace idem::relay
