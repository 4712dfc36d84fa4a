// expected_remaining and observe_duration: the estimate a claim answered
// in_progress reports as retry_after.
#include "core/expected_done.hpp"

#include <gtest/gtest.h>

namespace idem {
namespace {

constexpr Micros kLease = 30 * kSecond;

DurationEstimate steady(Micros duration, int samples) {
    DurationEstimate estimate;
    for (int i = 0; i < samples; ++i) estimate = observe_duration(estimate, duration);
    return estimate;
}

TEST(ExpectedDone, WithoutCompletionsTheLeaseLeft) {
    EXPECT_EQ(expected_remaining(DurationEstimate{}, 0, kLease), kLease);
    EXPECT_EQ(expected_remaining(DurationEstimate{}, 5 * kSecond, 12 * kSecond), 12 * kSecond);
}

TEST(ExpectedDone, ANegativeLeaseLeftIsZero) {
    EXPECT_EQ(expected_remaining(DurationEstimate{}, 0, -kSecond), 0);
    EXPECT_EQ(expected_remaining(steady(300 * kMillisecond, 20), 0, -kSecond), 0);
}

TEST(ExpectedDone, FirstSampleSetsMeanAndHalfDeviation) {
    const DurationEstimate estimate = observe_duration(DurationEstimate{}, 300 * kMillisecond);
    EXPECT_TRUE(estimate.known);
    EXPECT_EQ(estimate.mean, 300 * kMillisecond);
    EXPECT_EQ(estimate.deviation, 150 * kMillisecond);
}

TEST(ExpectedDone, NegativeDurationsAreIgnored) {
    const DurationEstimate estimate = steady(300 * kMillisecond, 3);
    const DurationEstimate after = observe_duration(estimate, -5 * kSecond);
    EXPECT_EQ(after.mean, estimate.mean);
    EXPECT_EQ(after.deviation, estimate.deviation);
    EXPECT_FALSE(observe_duration(DurationEstimate{}, -1).known);
}

TEST(ExpectedDone, SteadyWorkConvergesOnItsDuration) {
    const DurationEstimate estimate = steady(300 * kMillisecond, 40);
    EXPECT_EQ(estimate.mean, 300 * kMillisecond);
    EXPECT_LT(estimate.deviation, kMillisecond);
    // A 300 ms job just started: done in about 300 ms, far below the lease.
    const Micros left = expected_remaining(estimate, 0, kLease);
    EXPECT_GE(left, 300 * kMillisecond);
    EXPECT_LT(left, 310 * kMillisecond);
    // Half-way through: about 150 ms left.
    EXPECT_NEAR(expected_remaining(estimate, 150 * kMillisecond, kLease), 150 * kMillisecond,
                5 * kMillisecond);
}

TEST(ExpectedDone, OverdueWorkIsLookedAtAgainSoon) {
    const DurationEstimate estimate = steady(400 * kMillisecond, 40);
    EXPECT_NEAR(expected_remaining(estimate, 10 * kSecond, kLease), 100 * kMillisecond,
                2 * kMillisecond);
}

TEST(ExpectedDone, NeverMoreThanTheLeaseLeft) {
    const DurationEstimate estimate = steady(20 * kSecond, 10);
    EXPECT_EQ(expected_remaining(estimate, 0, 3 * kSecond), 3 * kSecond);
}

TEST(ExpectedDone, VaryingWorkAddsItsDeviation) {
    DurationEstimate estimate;
    for (int i = 0; i < 50; ++i)
        estimate = observe_duration(estimate, (i % 2 == 0 ? 100 : 500) * kMillisecond);
    EXPECT_GT(estimate.deviation, 100 * kMillisecond);
    // The typical duration covers the slow half: more than their 300 ms mean.
    EXPECT_GT(expected_remaining(estimate, 0, kLease), 450 * kMillisecond);
}

}  // namespace
}  // namespace idem
