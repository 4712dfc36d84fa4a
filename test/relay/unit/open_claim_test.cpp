// The loop's bookkeeping of the open transaction and of the outcomes not yet
// written: which outcomes a COMMIT takes, what a rollback drops, and when a
// late delivery of a rolled-back claim is ignored.
#include <gtest/gtest.h>

#include "relay/loop/open_claim.hpp"
#include "relay/loop/settle_queues.hpp"

using namespace idem::relay;

namespace {

Delivery delivery(std::int64_t id, std::uint64_t txn, Verdict verdict,
                  Clock::time_point lease_until = Clock::now() + std::chrono::seconds(30)) {
    Delivery d;
    d.event.id = id;
    d.event.txn = txn;
    d.event.lease_until = lease_until;
    d.outcome.verdict = verdict;
    return d;
}

std::vector<std::int64_t> ids(const std::vector<Delivery>& list) {
    std::vector<std::int64_t> out;
    for (const Delivery& d : list) out.push_back(d.event.id);
    return out;
}

}  // namespace

TEST(RelayOpenClaim, EachClaimHasItsOwnTransaction) {
    OpenClaim open;
    const Clock::time_point now = Clock::now();
    EXPECT_FALSE(open.is_open());
    const std::uint64_t first = open.open(now);
    open.delivering(2);
    EXPECT_TRUE(open.is_open());
    EXPECT_FALSE(open.ready(now, std::chrono::milliseconds(500)));
    EXPECT_TRUE(open.ready(now + std::chrono::milliseconds(500), std::chrono::milliseconds(500)));
    Event event;
    event.txn = first;
    EXPECT_TRUE(open.returned(event));
    EXPECT_TRUE(open.returned(event));
    EXPECT_TRUE(open.ready(now, std::chrono::milliseconds(500)));  // every outcome is in
    open.committed();
    EXPECT_FALSE(open.is_open());
    EXPECT_NE(open.open(now), first);
}

TEST(RelayOpenClaim, LateOutcomesOfARolledBackClaimAreDropped) {
    OpenClaim open;
    const std::uint64_t txn = open.open(Clock::now());
    open.delivering(2);
    open.rolled_back();
    EXPECT_FALSE(open.is_open());
    EXPECT_TRUE(open.voided_still_out());  // no claim until they end
    Event late;
    late.txn = txn;
    EXPECT_FALSE(open.returned(late));
    EXPECT_TRUE(open.voided_still_out());
    EXPECT_FALSE(open.returned(late));
    EXPECT_FALSE(open.voided_still_out());
    Event other;
    other.txn = txn + 100;  // an earlier, committed claim's
    EXPECT_TRUE(open.returned(other));
}

TEST(RelaySettleQueues, ACommitTakesEveryAckItsNacksAndTheReleasesItMay) {
    const Clock::time_point now = Clock::now();
    SettleQueues q;
    q.to_ack.push_back(delivery(1, 7, Verdict::Ack));
    q.to_ack.push_back(delivery(2, 6, Verdict::Ack));       // an earlier claim's
    q.to_nack.push_back(delivery(3, 7, Verdict::Retry));
    q.to_nack.push_back(delivery(4, 6, Verdict::Retry));    // may fail alone: later
    q.to_release.push_back(delivery(5, 7, Verdict::Skip));
    q.to_release.push_back(delivery(6, 6, Verdict::Skip));  // lease still runs: taken
    q.to_release.push_back(delivery(8, 6, Verdict::Skip, now - std::chrono::seconds(1)));
    q.hold(delivery(9, 7, Verdict::Dead), std::chrono::milliseconds(30000));

    const CommitBatch batch = q.take_for_commit(7, now, true);
    EXPECT_EQ(ids(batch.acks), (std::vector<std::int64_t>{1, 2}));
    EXPECT_EQ(ids(batch.nacks), (std::vector<std::int64_t>{3}));
    EXPECT_EQ(ids(batch.releases), (std::vector<std::int64_t>{5, 6}));
    EXPECT_EQ(ids(q.to_nack), (std::vector<std::int64_t>{4}));
    EXPECT_EQ(ids(q.to_release), (std::vector<std::int64_t>{8}));
    EXPECT_EQ(ids(q.held), (std::vector<std::int64_t>{9}));  // held: not written with it

    SettleQueues none;
    none.to_release.push_back(delivery(5, 7, Verdict::Skip));
    EXPECT_TRUE(none.take_for_commit(7, now, false).releases.empty());
    EXPECT_EQ(none.to_release.size(), 1u);
}

TEST(RelaySettleQueues, AFailedCommitGivesEarlierClaimsOutcomesBack) {
    SettleQueues q;
    CommitBatch batch;
    batch.acks.push_back(delivery(1, 7, Verdict::Ack));
    batch.acks.push_back(delivery(2, 6, Verdict::Ack));
    batch.nacks.push_back(delivery(3, 7, Verdict::Retry));
    batch.releases.push_back(delivery(5, 7, Verdict::Skip));
    batch.releases.push_back(delivery(6, 6, Verdict::Skip));
    const CommitBatch dropped = q.give_back(std::move(batch), 7);
    EXPECT_EQ(ids(dropped.acks), (std::vector<std::int64_t>{1}));
    EXPECT_EQ(ids(dropped.nacks), (std::vector<std::int64_t>{3}));
    EXPECT_EQ(ids(dropped.releases), (std::vector<std::int64_t>{5}));
    EXPECT_EQ(ids(q.to_ack), (std::vector<std::int64_t>{2}));
    EXPECT_EQ(ids(q.to_release), (std::vector<std::int64_t>{6}));
}

TEST(RelaySettleQueues, ARollbackDropsItsTransactionsOutcomes) {
    SettleQueues q;
    q.to_ack.push_back(delivery(1, 7, Verdict::Ack));
    q.to_ack.push_back(delivery(2, 6, Verdict::Ack));
    q.to_nack.push_back(delivery(3, 7, Verdict::Retry));
    q.to_release.push_back(delivery(5, 7, Verdict::Skip));
    q.hold(delivery(9, 7, Verdict::Dead), std::chrono::milliseconds(30000));
    std::size_t acks = 0;
    EXPECT_EQ(ids(q.drop(7, &acks)), (std::vector<std::int64_t>{1, 3, 5, 9}));
    EXPECT_EQ(acks, 1u);
    EXPECT_EQ(ids(q.to_ack), (std::vector<std::int64_t>{2}));
    EXPECT_EQ(q.size(), 1u);
}

TEST(RelaySettleQueues, HeldFailuresWaitUntilTheEarliestHalfLease) {
    const Clock::time_point now = Clock::now();
    const std::chrono::milliseconds lease(10000);
    SettleQueues q;
    q.hold(delivery(1, 7, Verdict::Dead, now + std::chrono::seconds(10)), lease);
    q.hold(delivery(2, 7, Verdict::Dead, now + std::chrono::seconds(8)), lease);
    q.hold(delivery(3, 7, Verdict::Dead, now + std::chrono::seconds(9)), lease);
    EXPECT_EQ(q.held_until, now + std::chrono::seconds(3));
    q.nack_held();
    EXPECT_TRUE(q.held.empty());
    EXPECT_EQ(ids(q.to_nack), (std::vector<std::int64_t>{1, 2, 3}));
    q.hold(delivery(4, 8, Verdict::Dead, now + std::chrono::seconds(20)), lease);
    EXPECT_EQ(q.held_until, now + std::chrono::seconds(15));  // a new wait, not the old one
    q.release_held();
    EXPECT_EQ(ids(q.to_release), (std::vector<std::int64_t>{4}));
}
