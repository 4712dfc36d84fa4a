// The relay's counters, shared by the database threads (writers: one per
// --connections lane, each adding what it did), delivery threads and the
// metrics endpoint (readers); rendered as Prometheus text.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace idem::relay {

// A cumulative histogram with fixed bucket bounds (seconds).
class Histogram {
public:
    static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                       0.1,   0.25,   0.5,   1,    5,     30};
    void observe(double seconds);
    void render(std::string& out, const std::string& name, const std::string& labels) const;
    std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }

private:
    std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
    std::atomic<std::uint64_t> count_{0};
    std::atomic<std::uint64_t> sum_micros_{0};
};

struct Stats {
    std::atomic<std::uint64_t> claimed{0};      // events handed to this relay
    std::atomic<std::uint64_t> delivered{0};    // acked
    std::atomic<std::uint64_t> retried{0};      // nacked, back to pending
    std::atomic<std::uint64_t> dead{0};         // nacked, dead
    std::atomic<std::uint64_t> skipped{0};      // claimed, not attempted (released or left to the lease)
    std::atomic<std::uint64_t> released{0};     // back to pending by outbox_release
    std::atomic<std::uint64_t> duplicates{0};   // acked, the broker had them already
    std::atomic<std::uint64_t> claims{0};       // outbox_claim calls
    std::atomic<std::uint64_t> notifications{0};
    std::atomic<std::uint64_t> reconnects{0};   // connections made after a loss
    std::atomic<std::uint64_t> db_errors{0};
    std::atomic<std::int64_t> in_flight{0};     // claimed, not yet acked or nacked
    std::atomic<std::int64_t> in_flight_bytes{0};  // their payloads and headers
    std::atomic<std::int64_t> waiting_retry{0};    // nacked as retryable, not delivered since
    std::atomic<std::uint64_t> not_attempted{0};   // not attempted and left to their lease
    std::atomic<int> lanes_down{0};             // lanes whose database connection is down
    std::atomic<bool> healthy{true};            // false once the relay is stopping on a failure
    std::atomic<bool> lag_known{false};
    std::atomic<double> lag_seconds{0};         // idempotency.outbox_lag, max over our topics
    Histogram delivery_seconds;                 // time in the sink
    Histogram delay_seconds;                    // enqueue to ack
    std::atomic<double> delay_max{0};           // enqueue to ack, largest since the last progress line

    bool connected() const { return lanes_down.load() == 0; }
    void observe_delay_max(double seconds);
    std::string prometheus(const std::string& relay) const;
};

}  // namespace idem::relay
