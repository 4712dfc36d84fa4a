// The claim whose transaction is open. A claim's transaction stays open
// while its events are delivered, so that their acks and nacks commit with
// the claim and each event is written once. Each claim's transaction gets a
// number (Event::txn); this counts the open one's events still being
// delivered, and remembers the transactions rolled back while some of their
// deliveries still ran: those deliveries' outcomes are dropped when they end
// (their events are pending again, no longer ours).
#pragma once

#include <cstdint>
#include <unordered_set>

#include "relay/event.hpp"

namespace idem::relay {

class OpenClaim {
public:
    // A claim opened a transaction at now: its number, for its events.
    std::uint64_t open(Clock::time_point now);
    // How many of its events went to the delivery threads.
    void delivering(std::int64_t count) { out_ = count; }

    bool is_open() const { return txn_ != 0; }
    std::uint64_t txn() const { return txn_; }
    bool holds(const Event& event) const { return txn_ != 0 && event.txn == txn_; }
    bool all_returned() const { return out_ == 0; }
    // When to commit even though deliveries still run: the claim is then
    // committed as it is (its events in flight, under their lease).
    Clock::time_point deadline(Clock::duration limit) const { return since_ + limit; }
    bool ready(Clock::time_point now, Clock::duration limit) const {
        return all_returned() || now >= deadline(limit);
    }

    // A delivery of this event ended. False when its transaction was rolled
    // back: drop the outcome.
    bool returned(const Event& event);
    // Deliveries of rolled-back transactions still run: while they do,
    // another claim could hand out the next event of their keys.
    bool voided_still_out() const { return void_out_ > 0; }

    // The transaction committed: what is still out stands as claimed.
    void committed();
    // The transaction was rolled back.
    void rolled_back();

private:
    std::uint64_t next_txn_ = 1;
    std::uint64_t txn_ = 0;  // 0: no transaction open
    Clock::time_point since_{};
    std::int64_t out_ = 0;   // its events still being delivered
    std::unordered_set<std::uint64_t> void_txns_;
    std::int64_t void_out_ = 0;  // their events still being delivered
};

}  // namespace idem::relay
