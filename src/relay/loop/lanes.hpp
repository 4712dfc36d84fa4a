// The lanes of one relay (--connections N): each lane is a database
// connection with its own claims, open transaction and delivery threads,
// run by a Relay loop on a thread of its own. The database shares the work
// out among them as among several relays (per-key order included); what
// they share in the process is here: a failure in one lane stops them all,
// and the events waiting for a retry are known to all (another lane may
// deliver an event that one lane nacked), counted in Stats::waiting_retry.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "relay/event.hpp"
#include "relay/observe/stats.hpp"
#include "relay/wake.hpp"

namespace idem::relay {

class LaneGroup {
public:
    // wakes: every lane's wake pipe.
    LaneGroup(std::vector<const WakePipe*> wakes, Stats& stats)
        : wakes_(std::move(wakes)), stats_(stats) {}

    // One lane failed: every lane stops claiming and drains, as on SIGTERM.
    void fail() {
        failed_ = true;
        for (const WakePipe* wake : wakes_) wake->notify();
    }
    bool failed() const { return failed_.load(); }

    // An event nacked as retryable waits for its retry until it is
    // delivered or dead.
    void retry_waits(std::int64_t id, bool waits) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waits) waiting_retry_.insert(id);
        else waiting_retry_.erase(id);
        stats_.waiting_retry = static_cast<std::int64_t>(waiting_retry_.size());
    }
    void delivered(const std::vector<Delivery>& deliveries) {
        // The usual case, nothing waiting: no lock per ack.
        if (stats_.waiting_retry.load() == 0) return;
        std::lock_guard<std::mutex> lock(mutex_);
        for (const Delivery& d : deliveries) waiting_retry_.erase(d.event.id);
        stats_.waiting_retry = static_cast<std::int64_t>(waiting_retry_.size());
    }

private:
    std::atomic<bool> failed_{false};
    const std::vector<const WakePipe*> wakes_;
    Stats& stats_;
    std::mutex mutex_;
    std::unordered_set<std::int64_t> waiting_retry_;
};

}  // namespace idem::relay
