// A sink that refuses the relay's configuration, not an event: a broker's
// refused credentials or vhost, a missing exchange or stream, an untrusted
// TLS certificate. No event could get through, so none is charged an
// attempt: the delivery thread that finds it records it here and hands its
// events back as skips (released, pending, attempts not counted); the relay
// then stops with exit 1 and says why (SinkTarget::fatal_error), as the
// HTTP sink's check (loop/sink_check.hpp) does for a status every event gets.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace idem::relay {

class SinkFault {
public:
    // The first reason wins; later ones are the same fault seen again.
    void set(const std::string& why);
    bool is_set() const { return set_.load(std::memory_order_acquire); }
    // "" while none was found.
    std::string reason() const;

private:
    std::atomic<bool> set_{false};
    mutable std::mutex mutex_;
    std::string why_;
};

}  // namespace idem::relay
