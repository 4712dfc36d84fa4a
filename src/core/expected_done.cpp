#include "core/expected_done.hpp"

#include <algorithm>

#include "core/cpp_only.hpp"

namespace idem {

DurationEstimate observe_duration(DurationEstimate estimate, Micros duration) {
    if (duration < 0) return estimate;
    if (!estimate.known) return DurationEstimate{duration, duration / 2, true};
    const Micros error = duration - estimate.mean;
    estimate.mean += error / 8;
    estimate.deviation += ((error < 0 ? -error : error) - estimate.deviation) / 4;
    return estimate;
}

Micros expected_remaining(const DurationEstimate& estimate, Micros elapsed, Micros lease_left) {
    lease_left = std::max<Micros>(lease_left, 0);
    if (!estimate.known) return lease_left;
    const Micros typical = estimate.mean + 2 * estimate.deviation;
    const Micros left = typical - std::max<Micros>(elapsed, 0);
    const Micros overdue_poll = typical / 4;
    return std::min(std::max(left, overdue_poll), lease_left);
}

}  // namespace idem
