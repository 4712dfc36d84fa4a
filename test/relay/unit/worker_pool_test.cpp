// The delivery threads and runs: events of one (topic, key) go out one
// after the other in the order claimed, never two at once, and the first
// that is not delivered stops the rest of its key (they come back as Skip,
// not tried); other keys go on.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "relay/loop/worker_pool.hpp"
#include "relay/observe/stats.hpp"
#include "relay/wake.hpp"

using namespace idem::relay;

namespace {

// Records what it is given; fails the events of `failing`; a delivery
// takes a moment, so that threads overlap.
class RecordingSink : public Sink {
public:
    struct Shared {
        std::mutex mutex;
        std::map<std::string, std::vector<std::int64_t>> order;  // per key, as delivered
        std::map<std::string, int> running;                      // per key, right now
        int most_at_once = 0;                                    // of one key
        std::vector<std::int64_t> failing;
        std::vector<std::int64_t> held_back;  // not tried: Skip, as a broker that blocks publishing
        bool all_or_nothing = false;  // a group goes out in order, all or nothing
        std::vector<std::size_t> groups;  // sizes, with all_or_nothing
        // With gated, a delivery, once started, waits until the gate opens.
        bool gated = false;
        bool gate_open = false;
        int started = 0;
        std::condition_variable gate;
    };
    explicit RecordingSink(Shared& shared) : shared_(shared) {}

    Outcome deliver(const Event& event) override {
        const std::string key = event.topic + "/" + event.key.value_or("");
        bool fail = false;
        {
            std::lock_guard<std::mutex> lock(shared_.mutex);
            for (std::int64_t id : shared_.held_back)
                if (id == event.id) return Outcome::skip("the broker blocked publishing");
            if (event.key)
                shared_.most_at_once = std::max(shared_.most_at_once, ++shared_.running[key]);
            shared_.order[key].push_back(event.id);
            for (std::int64_t id : shared_.failing) fail = fail || id == event.id;
        }
        if (shared_.gated) {
            std::unique_lock<std::mutex> lock(shared_.mutex);
            ++shared_.started;
            shared_.gate.notify_all();
            shared_.gate.wait(lock, [this] { return shared_.gate_open; });
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        {
            std::lock_guard<std::mutex> lock(shared_.mutex);
            if (event.key) --shared_.running[key];
        }
        return fail ? Outcome::retry("refused") : Outcome::ack();
    }

    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override {
        if (!shared_.all_or_nothing) return Sink::deliver_group(events, outcomes);
        {
            std::lock_guard<std::mutex> lock(shared_.mutex);
            shared_.groups.push_back(events.size());
        }
        bool failed = false;
        for (const Event* event : events)
            failed = deliver(*event).verdict != Verdict::Ack || failed;
        outcomes->assign(events.size(), failed ? Outcome::retry("refused") : Outcome::ack());
    }

private:
    Shared& shared_;
};

class RecordingTarget : public SinkTarget {
public:
    explicit RecordingTarget(std::size_t group) : group_(group) {}
    std::unique_ptr<Sink> open() override { return std::make_unique<RecordingSink>(shared); }
    Millis max_delivery_time() const override { return Millis(1000); }
    std::size_t group_size() const override { return group_; }
    bool groups_keep_order() const override { return shared.all_or_nothing; }
    std::string describe() const override { return "recording"; }
    RecordingSink::Shared shared;

private:
    std::size_t group_;
};

Event event(std::int64_t id, const char* key) {
    Event e;
    e.id = id;
    e.topic = "t";
    if (key != nullptr) e.key = key;
    e.lease_until = Clock::now() + std::chrono::minutes(5);
    return e;
}

// Submits the events and collects every outcome.
std::map<std::int64_t, Outcome> outcomes_of(RecordingTarget& target, int threads,
                                            std::vector<Event> events) {
    WakePipe wake;
    Stats stats;
    const std::size_t count = events.size();
    std::map<std::int64_t, Outcome> outcomes;
    {
        WorkerPool pool(target, threads, wake, stats);
        pool.submit(std::move(events));
        const auto deadline = Clock::now() + std::chrono::seconds(30);
        while (outcomes.size() < count && Clock::now() < deadline) {
            for (const Delivery& d : pool.take_results()) outcomes[d.event.id] = d.outcome;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        pool.stop();
    }
    return outcomes;
}

std::map<std::int64_t, Verdict> deliver_all(RecordingTarget& target, int threads,
                                            std::vector<Event> events) {
    std::map<std::int64_t, Verdict> verdicts;
    for (const auto& [id, outcome] : outcomes_of(target, threads, std::move(events)))
        verdicts[id] = outcome.verdict;
    return verdicts;
}

}  // namespace

TEST(RelayRuns, OneKeyGoesOutInOrderOneAtATime) {
    for (std::size_t group : {std::size_t{1}, std::size_t{8}}) {
        RecordingTarget target(group);
        std::vector<Event> events;
        std::int64_t id = 1;
        for (int i = 0; i < 20; ++i) events.push_back(event(id++, "A"));
        for (int i = 0; i < 20; ++i) events.push_back(event(id++, "B"));
        for (int i = 0; i < 20; ++i) events.push_back(event(id++, nullptr));
        const auto verdicts = deliver_all(target, 4, std::move(events));
        ASSERT_EQ(verdicts.size(), 60u) << "group " << group;
        for (const auto& [id, verdict] : verdicts) EXPECT_EQ(verdict, Verdict::Ack) << id;
        EXPECT_EQ(target.shared.most_at_once, 1) << "group " << group;
        std::vector<std::int64_t> a, b;
        for (std::int64_t i = 1; i <= 20; ++i) a.push_back(i);
        for (std::int64_t i = 21; i <= 40; ++i) b.push_back(i);
        EXPECT_EQ(target.shared.order["t/A"], a);
        EXPECT_EQ(target.shared.order["t/B"], b);
    }
}

TEST(RelayRuns, TheFirstFailureStopsTheRestOfItsKeyOnly) {
    RecordingTarget target(4);
    target.shared.failing = {3};
    std::vector<Event> events;
    for (std::int64_t id = 1; id <= 5; ++id) events.push_back(event(id, "A"));
    for (std::int64_t id = 6; id <= 8; ++id) events.push_back(event(id, "B"));
    events.push_back(event(9, nullptr));
    const auto verdicts = deliver_all(target, 2, std::move(events));
    ASSERT_EQ(verdicts.size(), 9u);
    EXPECT_EQ(verdicts.at(1), Verdict::Ack);
    EXPECT_EQ(verdicts.at(2), Verdict::Ack);
    EXPECT_EQ(verdicts.at(3), Verdict::Retry);
    EXPECT_EQ(verdicts.at(4), Verdict::Skip);
    EXPECT_EQ(verdicts.at(5), Verdict::Skip);
    for (std::int64_t id = 6; id <= 9; ++id) EXPECT_EQ(verdicts.at(id), Verdict::Ack) << id;
    // 4 and 5 were never tried.
    EXPECT_EQ(target.shared.order["t/A"], (std::vector<std::int64_t>{1, 2, 3}));
}

// The events behind one the sink did not try (Skip) are not tried for the
// same reason, which the relay's log then gives for all of them.
TEST(RelayRuns, TheRestOfAKeyBehindAnEventNotTriedHasItsReason) {
    RecordingTarget target(1);
    target.shared.held_back = {2};
    target.shared.failing = {5};
    std::vector<Event> events;
    for (std::int64_t id = 1; id <= 3; ++id) events.push_back(event(id, "A"));
    for (std::int64_t id = 4; id <= 6; ++id) events.push_back(event(id, "B"));
    const auto outcomes = outcomes_of(target, 2, std::move(events));
    ASSERT_EQ(outcomes.size(), 6u);
    EXPECT_EQ(outcomes.at(2).verdict, Verdict::Skip);
    EXPECT_EQ(outcomes.at(3).verdict, Verdict::Skip);
    EXPECT_EQ(outcomes.at(3).error, "the broker blocked publishing");
    // Behind a failure, the reason is the failure of an earlier event.
    EXPECT_EQ(outcomes.at(5).verdict, Verdict::Retry);
    EXPECT_EQ(outcomes.at(6).verdict, Verdict::Skip);
    EXPECT_EQ(outcomes.at(6).error, "an earlier event of its key was not delivered");
}

// A sink whose group goes out in order, all or nothing (stdout), takes a
// key's run in one group instead of one event at a time.
TEST(RelayRuns, ARunGoesOutInOneGroupWhereGroupsKeepOrder) {
    RecordingTarget target(100);
    target.shared.all_or_nothing = true;
    std::vector<Event> events;
    std::int64_t id = 1;
    for (int i = 0; i < 20; ++i) events.push_back(event(id++, "A"));
    for (int i = 0; i < 5; ++i) events.push_back(event(id++, nullptr));
    for (int i = 0; i < 20; ++i) events.push_back(event(id++, "B"));
    const auto verdicts = deliver_all(target, 1, std::move(events));
    ASSERT_EQ(verdicts.size(), 45u);
    for (const auto& [id, verdict] : verdicts) EXPECT_EQ(verdict, Verdict::Ack) << id;
    EXPECT_EQ(target.shared.groups, (std::vector<std::size_t>{45}));
    std::vector<std::int64_t> a, b;
    for (std::int64_t i = 1; i <= 20; ++i) a.push_back(i);
    for (std::int64_t i = 26; i <= 45; ++i) b.push_back(i);
    EXPECT_EQ(target.shared.order["t/A"], a);
    EXPECT_EQ(target.shared.order["t/B"], b);
}

// In such groups a failure still stops the rest of its key, and an event
// not sent (its lease would run out) stops the events of its key after it
// in the same group.
TEST(RelayRuns, AGroupedRunStopsAtItsFirstEventNotDelivered) {
    RecordingTarget target(2);
    target.shared.all_or_nothing = true;
    target.shared.failing = {3};
    std::vector<Event> events;
    for (std::int64_t id = 1; id <= 5; ++id) events.push_back(event(id, "A"));
    events.push_back(event(6, "B"));
    events.back().lease_until = Clock::now();  // would run out during the delivery
    events.push_back(event(7, "B"));
    events.push_back(event(8, "C"));
    const auto verdicts = deliver_all(target, 1, std::move(events));
    ASSERT_EQ(verdicts.size(), 8u);
    EXPECT_EQ(verdicts.at(1), Verdict::Ack);
    EXPECT_EQ(verdicts.at(2), Verdict::Ack);
    EXPECT_EQ(verdicts.at(3), Verdict::Retry);
    EXPECT_EQ(verdicts.at(4), Verdict::Retry);  // in 3's group: all or nothing
    EXPECT_EQ(verdicts.at(5), Verdict::Skip);
    EXPECT_EQ(verdicts.at(6), Verdict::Skip);
    EXPECT_EQ(verdicts.at(7), Verdict::Skip);
    EXPECT_EQ(verdicts.at(8), Verdict::Ack);
    EXPECT_EQ(target.shared.order["t/A"], (std::vector<std::int64_t>{1, 2, 3, 4}));
    EXPECT_EQ(target.shared.order.count("t/B"), 0u);
}

// With several threads, a sink whose groups keep order still never has two
// events of one key out at once, and each key's events go out in order.
TEST(RelayRuns, GroupsThatKeepOrderOnSeveralThreadsKeepEachKeyInOrder) {
    RecordingTarget target(3);
    target.shared.all_or_nothing = true;
    std::vector<Event> events;
    const char* keys[] = {"A", "B", "C", nullptr};
    for (std::int64_t id = 1; id <= 60; ++id) events.push_back(event(id, keys[id % 4]));
    const auto verdicts = deliver_all(target, 3, std::move(events));
    ASSERT_EQ(verdicts.size(), 60u);
    for (const auto& [id, verdict] : verdicts) EXPECT_EQ(verdict, Verdict::Ack) << id;
    EXPECT_EQ(target.shared.most_at_once, 1);
    for (const char* key : {"A", "B", "C"}) {
        const std::vector<std::int64_t>& order = target.shared.order[std::string("t/") + key];
        EXPECT_EQ(order.size(), 15u) << key;
        EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << key;
    }
}

// A stop: the events not started come back as Skip, and abandon_queued
// says how many they were; the delivery in progress finishes.
TEST(RelayStop, AbandonSaysHowManyEventsHadNotStarted) {
    RecordingTarget target(1);
    target.shared.gated = true;
    WakePipe wake;
    Stats stats;
    std::map<std::int64_t, Verdict> verdicts;
    {
        WorkerPool pool(target, 1, wake, stats);
        std::vector<Event> events;
        for (std::int64_t id = 1; id <= 5; ++id) events.push_back(event(id, nullptr));
        pool.submit(std::move(events));
        {
            std::unique_lock<std::mutex> lock(target.shared.mutex);
            ASSERT_TRUE(target.shared.gate.wait_for(lock, std::chrono::seconds(30),
                                                    [&] { return target.shared.started == 1; }));
        }
        EXPECT_EQ(pool.abandon_queued(), 4u);
        {
            std::lock_guard<std::mutex> lock(target.shared.mutex);
            target.shared.gate_open = true;
        }
        target.shared.gate.notify_all();
        const auto deadline = Clock::now() + std::chrono::seconds(30);
        while (verdicts.size() < 5 && Clock::now() < deadline) {
            for (const Delivery& d : pool.take_results()) verdicts[d.event.id] = d.outcome.verdict;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        pool.stop();
    }
    ASSERT_EQ(verdicts.size(), 5u);
    EXPECT_EQ(verdicts.at(1), Verdict::Ack);
    for (std::int64_t id = 2; id <= 5; ++id) EXPECT_EQ(verdicts.at(id), Verdict::Skip) << id;
    EXPECT_EQ(target.shared.started, 1);
}
