// How many events to claim: no more than the delivery threads can start
// before the claim's lease runs out (measured from the deliveries so far),
// and no more bytes in flight than --max-in-flight-bytes. Events claimed
// beyond what can be delivered in time would only be released again unused;
// other relays may take them meanwhile.
#pragma once

#include <cstdint>

#include "relay/options.hpp"

namespace idem::relay {

class ClaimSizer {
public:
    // longest_delivery: the most one delivery may take (--http-timeout).
    ClaimSizer(const Options& options, Millis longest_delivery);

    // The time one attempted delivery took.
    void delivered(double seconds);
    // The size (payload and headers) of a claimed event.
    void claimed(std::int64_t bytes);

    // Events to claim now (0: not now) with this much in flight.
    int want(std::int64_t in_flight, std::int64_t in_flight_bytes) const;
    // Events in flight at most, as far as the lease allows.
    int limit() const;

private:
    int batch_;
    int parallel_;
    double window_seconds_;  // time an event may wait for its turn: lease minus a delivery
    std::int64_t max_bytes_;
    double seconds_ = 0;     // moving average of a delivery's time (0: none yet)
    double bytes_ = 0;       // moving average of an event's size (0: none yet)
};

}  // namespace idem::relay
