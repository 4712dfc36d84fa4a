// The lanes of one relay (--connections N): each lane is a database
// connection with its own claims, open transaction and delivery threads,
// run by a Relay loop on a thread of its own. The database shares the work
// out among them as among several relays (per-key order included); what
// they share in the process is here: a failure in one lane stops them all,
// and the events waiting for a retry are known to all (another lane may
// deliver an event that one lane nacked).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "relay/wake.hpp"

namespace idem::relay {

class LaneGroup {
public:
    // Before the lanes start.
    void add(const WakePipe& wake) { wakes_.push_back(&wake); }
    // One lane failed: every lane stops claiming and drains, as on SIGTERM.
    void fail() {
        failed_ = true;
        for (const WakePipe* wake : wakes_) wake->notify();
    }
    bool failed() const { return failed_.load(); }

    // An event nacked as retryable waits for its retry until it is
    // delivered or dead; these return how many wait now.
    std::int64_t retry_waits(std::int64_t id, bool waits) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waits) waiting_retry_.insert(id);
        else waiting_retry_.erase(id);
        return static_cast<std::int64_t>(waiting_retry_.size());
    }
    std::int64_t delivered(const std::vector<std::int64_t>& ids) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const std::int64_t id : ids) waiting_retry_.erase(id);
        return static_cast<std::int64_t>(waiting_retry_.size());
    }

private:
    std::atomic<bool> failed_{false};
    std::vector<const WakePipe*> wakes_;
    std::mutex mutex_;
    std::unordered_set<std::int64_t> waiting_retry_;
};

}  // namespace idem::relay
