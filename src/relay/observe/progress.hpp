// The progress line on stderr (every --progress-interval, and a last one
// when the relay stops), from the counters of every lane.
#pragma once

#include <cstdint>

#include "relay/event.hpp"
#include "relay/observe/stats.hpp"

namespace idem::relay {

class ProgressLine {
public:
    explicit ProgressLine(Clock::time_point start) : last_(start) {}
    // The rate is over the time since the previous line.
    void print(Stats& stats, Clock::time_point now, bool final_line);

private:
    Clock::time_point last_;
    std::uint64_t last_delivered_ = 0;
};

}  // namespace idem::relay
