#include "relay/loop/reconnect_backoff.hpp"

#include <algorithm>

namespace idem::relay {

Millis Backoff::next() {
    const long long base = std::min<long long>(5000, 100LL << std::min(attempt_, 6));
    ++attempt_;
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    return Millis(static_cast<long long>(static_cast<double>(base) * jitter(random_)));
}

}  // namespace idem::relay
