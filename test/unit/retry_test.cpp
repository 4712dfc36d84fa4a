// backoff_delay, attempts_left, decide_fail and decide_release against the rules of
// idem_fail and idem_release: exponential backoff from retry_base_delay,
// capped at retry_max_delay, with jitter; the dead letter; the attempt given
// back by a release.
#include "core/retry.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace idem {
namespace {

constexpr Micros kHour = 3600 * kSecond;
constexpr Micros kMax64 = std::numeric_limits<Micros>::max();
constexpr std::int32_t kMax32 = std::numeric_limits<std::int32_t>::max();

// The defaults: max_attempts 5, retry_base_delay 1s, retry_max_delay 1h.
constexpr RetryPolicy kDefaults{5, kSecond, kHour};

const double kJustBelowOne = std::nextafter(1.0, 0.0);
const std::vector<double> kJitters = {0.0, 1e-12, 0.25, 0.5, 0.75, 0.999999, kJustBelowOne, 1.0};

// The documented delay before jitter: base * 2^(n-1) capped at max, computed
// without overflow in 128-bit arithmetic (n < 1 counts as the first failure).
Micros capped_delay(std::int32_t attempts, Micros base, Micros max) {
    if (base <= 0 || max <= 0) return 0;
    __int128 d = base;
    for (std::int32_t n = 1; n < attempts && d < max; ++n) d *= 2;
    return static_cast<Micros>(d < max ? d : static_cast<__int128>(max));
}

// ------------------------------------------------------------ backoff_delay

TEST(BackoffDelay, DoublesFromTheBaseUpToTheCap) {
    // Upper end of the jitter range (jitter -> 1) is the capped delay itself.
    const Micros expected[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600};
    for (std::int32_t n = 1; n <= 14; ++n) {
        SCOPED_TRACE(n);
        EXPECT_EQ(backoff_delay(n, kSecond, kHour, 1.0), expected[n - 1] * kSecond);
        // Lower end: half of it.
        EXPECT_EQ(backoff_delay(n, kSecond, kHour, 0.0), expected[n - 1] * kSecond / 2);
    }
}

TEST(BackoffDelay, JitterDrawsFromTheUpperHalf) {
    // n = 3: d = 4s, so the delay is 2s + jitter * 2s.
    EXPECT_EQ(backoff_delay(3, kSecond, kHour, 0.0), 2 * kSecond);
    EXPECT_EQ(backoff_delay(3, kSecond, kHour, 0.5), 3 * kSecond);
    EXPECT_EQ(backoff_delay(3, kSecond, kHour, 0.25), 2500 * kMillisecond);
    EXPECT_LT(backoff_delay(3, kSecond, kHour, kJustBelowOne), 4 * kSecond);
    EXPECT_GE(backoff_delay(3, kSecond, kHour, kJustBelowOne), 4 * kSecond - 1);
}

TEST(BackoffDelay, WorkersThatFailedTogetherDoNotRetryTogether) {
    for (std::int32_t n = 1; n <= 20; ++n)
        EXPECT_LT(backoff_delay(n, kSecond, kHour, 0.1), backoff_delay(n, kSecond, kHour, 0.9));
}

TEST(BackoffDelay, AlwaysWithinTheUpperHalfOfTheCappedDelay) {
    const std::vector<Micros> bases = {1, 3, 999, kMillisecond, kSecond, 7 * kSecond, kHour,
                                       kDay, kMax64 / 3, kMax64 / 2, kMax64 / 2 + 1, kMax64 - 1,
                                       kMax64};
    const std::vector<Micros> maxes = {1, 2, 3, kSecond, kHour, kHour + 1, kDay, kHundredYears,
                                       kMax64 / 2, kMax64 - 2, kMax64 - 1, kMax64};
    const std::vector<std::int32_t> attempts = {1, 2, 3, 10, 31, 32, 62, 63, 64, 65, 100,
                                                 1'000'000, kMax32 - 1, kMax32};
    for (Micros base : bases)
        for (Micros max : maxes)
            for (std::int32_t n : attempts)
                for (double jitter : kJitters) {
                    const Micros d = capped_delay(n, base, max);
                    const Micros got = backoff_delay(n, base, max, jitter);
                    ASSERT_GE(got, d / 2) << "n=" << n << " base=" << base << " max=" << max
                                          << " jitter=" << jitter;
                    ASSERT_LE(got, d) << "n=" << n << " base=" << base << " max=" << max
                                      << " jitter=" << jitter;
                }
}

TEST(BackoffDelay, NeverShrinksAsAttemptsGrow) {
    for (double jitter : kJitters)
        for (Micros max : {kHour, kHour + 1, kMax64}) {
            Micros previous = 0;
            for (std::int32_t n = 1; n <= 130; ++n) {
                const Micros got = backoff_delay(n, kSecond, max, jitter);
                ASSERT_GE(got, previous) << "n=" << n << " jitter=" << jitter;
                previous = got;
            }
            EXPECT_GE(backoff_delay(kMax32, kSecond, max, jitter), previous);
        }
}

TEST(BackoffDelay, NeverExceedsTheCapOnceReached) {
    // From n = 13 on, 1s * 2^(n-1) >= 1h: the delay stays in [30min, 1h].
    for (std::int32_t n : {13, 14, 40, 63, 64, 1000, kMax32})
        for (double jitter : kJitters) {
            const Micros got = backoff_delay(n, kSecond, kHour, jitter);
            EXPECT_GE(got, kHour / 2);
            EXPECT_LE(got, kHour);
        }
    EXPECT_EQ(backoff_delay(kMax32, kSecond, kHour, 1.0), kHour);
    EXPECT_EQ(backoff_delay(kMax32, kSecond, kHour, 0.0), kHour / 2);
}

TEST(BackoffDelay, NoOverflowAtTheExtremes) {
    // base * 2^(INT32_MAX-1) does not fit anywhere: the cap must win without
    // the arithmetic wrapping to a negative or small value.
    EXPECT_EQ(backoff_delay(kMax32, 1, kMax64, 1.0), kMax64);
    EXPECT_GE(backoff_delay(kMax32, 1, kMax64, 0.0), kMax64 / 2);
    EXPECT_EQ(backoff_delay(kMax32, kMax64, kMax64, 1.0), kMax64);
    EXPECT_EQ(backoff_delay(2, kMax64 / 2 + 1, kMax64, 1.0), kMax64);
    EXPECT_EQ(backoff_delay(64, kMax64 / 3, kMax64 - 1, 1.0), kMax64 - 1);
    for (double jitter : kJitters) {
        EXPECT_GT(backoff_delay(kMax32, kMax64, kMax64, jitter), 0);
        EXPECT_LE(backoff_delay(kMax32, kMax64 - 2, kMax64 - 2, jitter), kMax64 - 2);
    }
}

TEST(BackoffDelay, BaseAboveTheCapIsCappedFromTheFirstAttempt) {
    EXPECT_EQ(backoff_delay(1, 2 * kHour, kHour, 1.0), kHour);
    EXPECT_EQ(backoff_delay(1, 2 * kHour, kHour, 0.0), kHour / 2);
}

TEST(BackoffDelay, ZeroBaseOrCapMeansNoDelay) {
    for (std::int32_t n : {1, 2, 64, kMax32})
        for (double jitter : kJitters) {
            EXPECT_EQ(backoff_delay(n, 0, kHour, jitter), 0);
            EXPECT_EQ(backoff_delay(n, kSecond, 0, jitter), 0);
            EXPECT_EQ(backoff_delay(n, 0, 0, jitter), 0);
        }
}

TEST(BackoffDelay, NonPositiveAttemptsCountAsTheFirst) {
    for (std::int32_t n : {0, -1, std::numeric_limits<std::int32_t>::min()}) {
        EXPECT_EQ(backoff_delay(n, kSecond, kHour, 1.0), kSecond);
        EXPECT_EQ(backoff_delay(n, kSecond, kHour, 0.0), kSecond / 2);
    }
}

TEST(BackoffDelay, JitterOutsideItsRangeStaysInBounds) {
    for (double jitter : {-1.0, -1e300, 1.5, 1e300, std::numeric_limits<double>::infinity(),
                          -std::numeric_limits<double>::infinity()}) {
        const Micros got = backoff_delay(3, kSecond, kHour, jitter);
        EXPECT_GE(got, 2 * kSecond) << jitter;
        EXPECT_LE(got, 4 * kSecond) << jitter;
    }
}

// ----------------------------------------------------------- attempts_left

TEST(AttemptsLeft, TheRecordedCapWinsOverTheCallersOne) {
    EXPECT_TRUE(attempts_left(2, 3, 1));
    EXPECT_FALSE(attempts_left(3, 3, 10));
    EXPECT_FALSE(attempts_left(4, 3, 10));
}

TEST(AttemptsLeft, WithoutARecordedCapTheCallersOneApplies) {
    EXPECT_TRUE(attempts_left(0, std::nullopt, 1));
    EXPECT_FALSE(attempts_left(1, std::nullopt, 1));
    EXPECT_TRUE(attempts_left(9, std::nullopt, 10));
}

// ------------------------------------------------------------- decide_fail

TEST(DecideFail, RetryableUsesTheBackoffOfThisAttempt) {
    for (std::int32_t attempts = 1; attempts < kDefaults.max_attempts; ++attempts)
        for (double jitter : kJitters) {
            SCOPED_TRACE(attempts);
            const FailDecision d = decide_fail(attempts, true, std::nullopt, kDefaults, jitter);
            EXPECT_EQ(d.next, Status::FailedRetryable);
            ASSERT_TRUE(d.delay.has_value());
            const Micros cap = capped_delay(attempts, kSecond, kHour);  // 1s, 2s, 4s, 8s
            EXPECT_GE(*d.delay, cap / 2);
            EXPECT_LE(*d.delay, cap);
            EXPECT_EQ(*d.delay, backoff_delay(attempts, kSecond, kHour, jitter));
        }
}

TEST(DecideFail, RetryInReplacesTheBackoff) {
    // coalesce(retry_in, backoff): zero is a valid retry_in, and it is not capped
    // by retry_max_delay.
    for (Micros retry_in : {Micros{0}, Micros{1}, 10 * 60 * kSecond, 2 * kHour, kHundredYears}) {
        const FailDecision d = decide_fail(2, true, retry_in, kDefaults, 0.5);
        EXPECT_EQ(d.next, Status::FailedRetryable);
        ASSERT_TRUE(d.delay.has_value());
        EXPECT_EQ(*d.delay, retry_in);
    }
}

TEST(DecideFail, NotRetryableIsFinal) {
    for (std::int32_t attempts : {1, 2, kDefaults.max_attempts})
        for (std::optional<Micros> retry_in : {std::optional<Micros>(), std::optional<Micros>(0),
                                               std::optional<Micros>(kSecond)}) {
            const FailDecision d = decide_fail(attempts, false, retry_in, kDefaults, 0.5);
            EXPECT_EQ(d.next, Status::FailedFinal);
            EXPECT_FALSE(d.delay.has_value());  // the dead letter is never retried
        }
}

TEST(DecideFail, AttemptsExhaustedIsFinalEvenWhenRetryable) {
    for (std::int32_t attempts : {kDefaults.max_attempts, kDefaults.max_attempts + 1, kMax32})
        for (std::optional<Micros> retry_in : {std::optional<Micros>(),
                                               std::optional<Micros>(kSecond)}) {
            SCOPED_TRACE(attempts);
            const FailDecision d = decide_fail(attempts, true, retry_in, kDefaults, 0.5);
            EXPECT_EQ(d.next, Status::FailedFinal);
            EXPECT_FALSE(d.delay.has_value());
        }
}

TEST(DecideFail, LastAttemptBeforeTheLimitIsStillRetryable) {
    const FailDecision d = decide_fail(kDefaults.max_attempts - 1, true, std::nullopt, kDefaults, 0);
    EXPECT_EQ(d.next, Status::FailedRetryable);
}

TEST(DecideFail, MaxAttemptsOfOneMakesEveryFailureFinal) {
    const RetryPolicy once{1, kSecond, kHour};
    EXPECT_EQ(decide_fail(1, true, std::nullopt, once, 0.5).next, Status::FailedFinal);
}

TEST(DecideFail, ZeroBaseDelayRetriesAtOnce) {
    const RetryPolicy immediate{5, 0, kHour};
    const FailDecision d = decide_fail(3, true, std::nullopt, immediate, 0.7);
    EXPECT_EQ(d.next, Status::FailedRetryable);
    ASSERT_TRUE(d.delay.has_value());
    EXPECT_EQ(*d.delay, 0);
}

// ---------------------------------------------------------- decide_release

KeyState held(std::int32_t attempts, bool registered, Status status = Status::Processing) {
    KeyState state;
    state.status = status;
    state.token = 7;
    state.attempts = attempts;
    state.registered = registered;
    return state;
}

TEST(DecideRelease, RegisteredKeyGoesBackToReceived) {
    for (std::int32_t attempts : {1, 2, 5})
        EXPECT_EQ(decide_release(held(attempts, true)), ReleaseAction::BackToReceived);
}

TEST(DecideRelease, KeyTheClaimCreatedIsRemoved) {
    EXPECT_EQ(decide_release(held(1, false)), ReleaseAction::Delete);
}

TEST(DecideRelease, UnregisteredKeyWithEarlierAttemptsIsRemovedToo) {
    // "back to RECEIVED when the key had been registered, otherwise the
    // key is removed", whatever attempts came before.
    for (std::int32_t attempts : {2, 3, 5})
        EXPECT_EQ(decide_release(held(attempts, false)), ReleaseAction::Delete) << attempts;
}

TEST(DecideRelease, KeyWithFinishedStepsIsKeptWithThem) {
    // Its steps' effects have committed: removing the key would have the
    // next claim run them again.
    for (bool registered : {false, true})
        for (std::int32_t attempts : {1, 2, 5}) {
            KeyState state = held(attempts, registered);
            state.has_steps = true;
            EXPECT_EQ(decide_release(state), ReleaseAction::BackToReceived) << attempts;
        }
}

TEST(DecideRelease, LateHolderReleaseFollowsTheSameRule) {
    // A holder whose lease expired may still release while nobody claimed again.
    KeyState registered = held(2, true, Status::FailedRetryable);
    registered.lease_expired = true;
    EXPECT_EQ(decide_release(registered), ReleaseAction::BackToReceived);
    KeyState created = held(1, false, Status::FailedRetryable);
    created.lease_expired = true;
    EXPECT_EQ(decide_release(created), ReleaseAction::Delete);
    KeyState retried = held(3, false, Status::FailedFinal);
    retried.lease_expired = true;
    EXPECT_EQ(decide_release(retried), ReleaseAction::Delete);
}

}  // namespace
}  // namespace idem
