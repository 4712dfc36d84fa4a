#include "relay/sinks/sink_fault.hpp"

namespace idem::relay {

void SinkFault::set(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (set_.load(std::memory_order_relaxed)) return;
    why_ = why;
    set_.store(true, std::memory_order_release);
}

std::string SinkFault::reason() const {
    if (!is_set()) return {};
    std::lock_guard<std::mutex> lock(mutex_);
    return why_;
}

}  // namespace idem::relay
