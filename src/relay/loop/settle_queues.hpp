// The outcomes the database has not recorded yet, by what they become: acks,
// nacks, releases (back to pending, no attempt counted), and final failures
// held back while the sink check cannot tell a misconfigured sink from
// undeliverable events. Each keeps its claim's transaction (Event::txn):
// the COMMIT of the open claim takes what it can write with it, and a
// rollback drops what belonged to the transaction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "relay/event.hpp"

namespace idem::relay {

// What one COMMIT writes besides the claim.
struct CommitBatch {
    std::vector<Delivery> acks, nacks, releases;
    std::size_t size() const { return acks.size() + nacks.size() + releases.size(); }
};

struct SettleQueues {
    std::vector<Delivery> to_ack;
    std::vector<Delivery> to_nack;
    std::vector<Delivery> to_release;
    std::vector<Delivery> held;
    Clock::time_point held_until{};  // when held must be settled anyway

    bool empty() const {
        return to_ack.empty() && to_nack.empty() && to_release.empty() && held.empty();
    }
    std::size_t size() const {
        return to_ack.size() + to_nack.size() + to_release.size() + held.size();
    }

    // Holds a final failure until its lease is half gone (the earliest of
    // those held decides), so that another delivery may yet decide.
    void hold(Delivery&& delivery, std::chrono::milliseconds lease);
    // The held failures go out as nacks (the sink works) or back to pending
    // (it does not, or there is no more time to decide).
    void nack_held();
    void release_held();

    // For the COMMIT of transaction txn: every ack (the open claim's and
    // those of earlier claims), txn's nacks (a nack of an earlier claim may
    // fail alone), and, when releases can be written, txn's releases and
    // those whose lease still runs. The rest stays.
    CommitBatch take_for_commit(std::uint64_t txn, Clock::time_point now, bool can_release);
    // A COMMIT failed: the outcomes of earlier claims it carried come back
    // to be written; those of txn are dropped with it. Returns those dropped.
    CommitBatch give_back(CommitBatch&& batch, std::uint64_t txn);
    // Transaction txn was rolled back: its outcomes are dropped. Returns
    // them; *acks says how many were acks.
    std::vector<Delivery> drop(std::uint64_t txn, std::size_t* acks);
};

}  // namespace idem::relay
