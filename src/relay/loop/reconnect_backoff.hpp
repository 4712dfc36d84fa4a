// How long to wait before the next attempt to reconnect to the database:
// 100 ms doubling to 5 s, with jitter so that lanes and relays that lost
// the server together do not come back in step.
#pragma once

#include <random>

#include "relay/options.hpp"

namespace idem::relay {

class Backoff {
public:
    Millis next();
    void reset() { attempt_ = 0; }
    int attempts() const { return attempt_; }

private:
    int attempt_ = 0;
    std::minstd_rand random_{std::random_device{}()};
};

}  // namespace idem::relay
