// decide_claim and decide_register against the README's rules for
// idem_claim and idem_register, and its table of outcomes: which outcome each stored
// state gives, which calls change the key, and what retry_after says.
#include "core/claim_decision.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace idem {
namespace {

constexpr Micros kNow = 1'700'000'000 * kSecond;  // an arbitrary wall-clock instant
constexpr int kMaxAttempts = 5;                   // idempotency.max_attempts default

constexpr Status kAllStatuses[] = {Status::Received, Status::Processing, Status::Completed,
                                   Status::FailedRetryable, Status::FailedFinal};

KeyState key(Status status, std::int32_t attempts = 1) {
    KeyState state;
    state.status = status;
    state.attempts = attempts;
    if (status != Status::Received) state.token = 42;
    return state;
}

KeyState processing(Micros lease_until, std::int32_t attempts = 1) {
    KeyState state = key(Status::Processing, attempts);
    state.lease_until = lease_until;
    return state;
}

KeyState retryable(std::optional<Micros> next_attempt_at, std::int32_t attempts = 1) {
    KeyState state = key(Status::FailedRetryable, attempts);
    state.next_attempt_at = next_attempt_at;
    return state;
}

// Stored states worth trying for properties that must hold in every state.
std::vector<KeyState> sample_states() {
    return {
        key(Status::Received, 0),
        key(Status::Received, 2),
        processing(kNow + 10 * kSecond),
        processing(kNow - 1),
        processing(kNow - 1, kMaxAttempts),
        key(Status::Completed),
        retryable(kNow + kSecond),
        retryable(kNow - kSecond),
        retryable(std::nullopt),
        key(Status::FailedFinal, kMaxAttempts),
    };
}

// ------------------------------------------------------------ decide_claim

TEST(DecideClaim, ReceivedIsClaimed) {
    const ClaimDecision d = decide_claim(key(Status::Received, 0), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_EQ(d.action, ClaimAction::Grant);
    EXPECT_FALSE(d.retry_after.has_value());
    EXPECT_FALSE(d.takeover);  // nobody held it
    EXPECT_TRUE(claim_may_change(d));
}

TEST(DecideClaim, ReceivedAfterReleaseIsClaimedWhateverItsAttempts) {
    // A registered key given back by release keeps its earlier attempts;
    // "Absent or RECEIVED -> PROCESSING, claimed" has no condition.
    const ClaimDecision d = decide_claim(key(Status::Received, 3), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_EQ(d.action, ClaimAction::Grant);
}

TEST(DecideClaim, LiveLeaseIsInProgressWithTheLeaseLeft) {
    const ClaimDecision d =
        decide_claim(processing(kNow + 12 * kSecond), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::InProgress);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    ASSERT_TRUE(d.retry_after.has_value());
    EXPECT_EQ(*d.retry_after, 12 * kSecond);
    EXPECT_FALSE(d.takeover);
    EXPECT_FALSE(claim_may_change(d));  // answered from a plain read
}

TEST(DecideClaim, LeaseWithOneMicrosecondLeftIsStillLive) {
    const ClaimDecision d = decide_claim(processing(kNow + 1), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::InProgress);
    ASSERT_TRUE(d.retry_after.has_value());
    EXPECT_EQ(*d.retry_after, 1);
}

TEST(DecideClaim, LiveLeaseWithAttemptsExhaustedIsStillInProgress) {
    // Exhaustion only matters once the lease has expired.
    const ClaimDecision d =
        decide_claim(processing(kNow + kSecond, kMaxAttempts), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::InProgress);
    EXPECT_EQ(d.action, ClaimAction::Answer);
}

TEST(DecideClaim, ExpiredLeaseIsTakenOver) {
    const ClaimDecision d =
        decide_claim(processing(kNow - kSecond, 2), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_EQ(d.action, ClaimAction::Grant);
    EXPECT_TRUE(d.takeover);
    EXPECT_FALSE(d.retry_after.has_value());
    EXPECT_TRUE(claim_may_change(d));
}

TEST(DecideClaim, LeaseEndingNowHasExpired) {
    // lease_until is the instant the lease ends: at that instant nobody holds it.
    const ClaimDecision d = decide_claim(processing(kNow), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_TRUE(d.takeover);
}

TEST(DecideClaim, ExpiredLeaseWithOneAttemptLeftIsTakenOver) {
    const ClaimDecision d =
        decide_claim(processing(kNow - 1, kMaxAttempts - 1), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_EQ(d.action, ClaimAction::Grant);
    EXPECT_TRUE(d.takeover);
}

TEST(DecideClaim, ExpiredLeaseWithAttemptsExhaustedBecomesFinal) {
    for (std::int32_t attempts : {kMaxAttempts, kMaxAttempts + 1, 1000}) {
        SCOPED_TRACE(attempts);
        const ClaimDecision d =
            decide_claim(processing(kNow - 1, attempts), false, kNow, kMaxAttempts);
        EXPECT_EQ(d.outcome, Outcome::Failed);
        EXPECT_EQ(d.action, ClaimAction::ExpireToFinal);
        EXPECT_FALSE(d.retry_after.has_value());
        EXPECT_TRUE(claim_may_change(d));  // it writes FAILED_FINAL
    }
}

TEST(DecideClaim, MaxAttemptsOfOneMakesTheFirstExpiryFinal) {
    const ClaimDecision d = decide_claim(processing(kNow - 1, 1), false, kNow, 1);
    EXPECT_EQ(d.outcome, Outcome::Failed);
    EXPECT_EQ(d.action, ClaimAction::ExpireToFinal);
}

TEST(DecideClaim, CompletedReplays) {
    for (std::int32_t attempts : {1, kMaxAttempts}) {
        const ClaimDecision d =
            decide_claim(key(Status::Completed, attempts), false, kNow, kMaxAttempts);
        EXPECT_EQ(d.outcome, Outcome::Completed);
        EXPECT_EQ(d.action, ClaimAction::Answer);  // never back to PROCESSING
        EXPECT_FALSE(d.retry_after.has_value());
        EXPECT_FALSE(claim_may_change(d));
    }
}

TEST(DecideClaim, RetryableBeforeItsBackoffIsRetryLater) {
    const ClaimDecision d =
        decide_claim(retryable(kNow + 1500 * kMillisecond, 2), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::RetryLater);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    ASSERT_TRUE(d.retry_after.has_value());
    EXPECT_EQ(*d.retry_after, 1500 * kMillisecond);
    EXPECT_FALSE(claim_may_change(d));
}

TEST(DecideClaim, RetryableOnceItsBackoffHasPassedIsClaimed) {
    for (Micros next : {kNow, kNow - 1, kNow - kDay}) {
        SCOPED_TRACE(next - kNow);
        const ClaimDecision d = decide_claim(retryable(next, 2), false, kNow, kMaxAttempts);
        EXPECT_EQ(d.outcome, Outcome::Claimed);
        EXPECT_EQ(d.action, ClaimAction::Grant);
        EXPECT_FALSE(d.retry_after.has_value());
        // The lease had already ended (fail or worker expiry): no lease is taken over.
        EXPECT_FALSE(d.takeover);
    }
}

TEST(DecideClaim, RetryableWithoutBackoffIsClaimedAtOnce) {
    // An expired lease leaves the key "claimable at once (no backoff)".
    KeyState state = retryable(std::nullopt, 1);
    state.lease_expired = true;
    const ClaimDecision d = decide_claim(state, false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Claimed);
    EXPECT_EQ(d.action, ClaimAction::Grant);
}

TEST(DecideClaim, FailedFinalIsFailed) {
    const ClaimDecision d =
        decide_claim(key(Status::FailedFinal, kMaxAttempts), false, kNow, kMaxAttempts);
    EXPECT_EQ(d.outcome, Outcome::Failed);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    EXPECT_FALSE(d.retry_after.has_value());
    EXPECT_FALSE(claim_may_change(d));
}

TEST(DecideClaim, FingerprintConflictIsMismatchInEveryState) {
    for (const KeyState& state : sample_states()) {
        SCOPED_TRACE(status_label(state.status));
        const ClaimDecision d = decide_claim(state, true, kNow, kMaxAttempts);
        EXPECT_EQ(d.outcome, Outcome::Mismatch);
        EXPECT_EQ(d.action, ClaimAction::Answer);  // "nothing changed"
        EXPECT_FALSE(d.retry_after.has_value());
        EXPECT_FALSE(d.takeover);
        EXPECT_FALSE(claim_may_change(d));
    }
}

TEST(DecideClaim, RetryAfterIsSetExactlyForInProgressAndRetryLater) {
    for (const KeyState& state : sample_states()) {
        SCOPED_TRACE(status_label(state.status));
        const ClaimDecision d = decide_claim(state, false, kNow, kMaxAttempts);
        const bool waits = d.outcome == Outcome::InProgress || d.outcome == Outcome::RetryLater;
        EXPECT_EQ(d.retry_after.has_value(), waits);
        if (d.retry_after) {
            EXPECT_GT(*d.retry_after, 0);  // a wait that is over is no wait
        }
    }
}

TEST(DecideClaim, OnlyGrantsAndExpiriesMayChangeTheKey) {
    for (const KeyState& state : sample_states()) {
        for (bool conflict : {false, true}) {
            const ClaimDecision d = decide_claim(state, conflict, kNow, kMaxAttempts);
            EXPECT_EQ(claim_may_change(d), d.action != ClaimAction::Answer);
            // Claimed goes with a grant, and a grant always answers claimed.
            EXPECT_EQ(d.outcome == Outcome::Claimed, d.action == ClaimAction::Grant);
            if (d.takeover) {
                EXPECT_EQ(d.action, ClaimAction::Grant);
            }
            EXPECT_NE(d.outcome, Outcome::Registered);
        }
    }
}

// --------------------------------------------------------- decide_register

TEST(DecideRegister, ReceivedIsInProgressAndQueued) {
    for (std::int32_t attempts : {0, 2}) {
        const ClaimDecision d = decide_register(key(Status::Received, attempts), false, kNow);
        EXPECT_EQ(d.outcome, Outcome::InProgress);
        EXPECT_EQ(d.action, ClaimAction::Answer);
        // retry_after is set for in_progress; a queued key has no lease
        // left, so it is zero.
        ASSERT_TRUE(d.retry_after.has_value());
        EXPECT_EQ(*d.retry_after, 0);
    }
}

TEST(DecideRegister, ProcessingIsInProgressWithTheLeaseLeft) {
    const ClaimDecision d = decide_register(processing(kNow + 7 * kSecond), false, kNow);
    EXPECT_EQ(d.outcome, Outcome::InProgress);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    ASSERT_TRUE(d.retry_after.has_value());
    EXPECT_EQ(*d.retry_after, 7 * kSecond);
}

TEST(DecideRegister, ExpiredLeaseIsInProgressWithNothingLeftAndNoChange) {
    // register never changes an existing key, even one a claim would expire.
    for (std::int32_t attempts : {1, kMaxAttempts}) {
        const ClaimDecision d = decide_register(processing(kNow - kSecond, attempts), false, kNow);
        EXPECT_EQ(d.outcome, Outcome::InProgress);
        EXPECT_EQ(d.action, ClaimAction::Answer);
        ASSERT_TRUE(d.retry_after.has_value());
        EXPECT_EQ(*d.retry_after, 0);  // never negative
    }
}

TEST(DecideRegister, RetryableIsInProgressWithTheBackoffLeft) {
    const ClaimDecision d = decide_register(retryable(kNow + 3 * kSecond), false, kNow);
    EXPECT_EQ(d.outcome, Outcome::InProgress);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    ASSERT_TRUE(d.retry_after.has_value());
    EXPECT_EQ(*d.retry_after, 3 * kSecond);
}

TEST(DecideRegister, RetryableWhoseBackoffPassedIsInProgressWithNothingLeft) {
    for (std::optional<Micros> next : {std::optional<Micros>(kNow - kSecond),
                                       std::optional<Micros>(kNow), std::optional<Micros>()}) {
        const ClaimDecision d = decide_register(retryable(next), false, kNow);
        EXPECT_EQ(d.outcome, Outcome::InProgress);
        ASSERT_TRUE(d.retry_after.has_value());
        EXPECT_EQ(*d.retry_after, 0);
    }
}

TEST(DecideRegister, CompletedReplays) {
    const ClaimDecision d = decide_register(key(Status::Completed), false, kNow);
    EXPECT_EQ(d.outcome, Outcome::Completed);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    EXPECT_FALSE(d.retry_after.has_value());
}

TEST(DecideRegister, FailedFinalIsFailed) {
    const ClaimDecision d = decide_register(key(Status::FailedFinal, kMaxAttempts), false, kNow);
    EXPECT_EQ(d.outcome, Outcome::Failed);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    EXPECT_FALSE(d.retry_after.has_value());
}

TEST(DecideRegister, FingerprintConflictIsMismatchInEveryState) {
    for (const KeyState& state : sample_states()) {
        SCOPED_TRACE(status_label(state.status));
        const ClaimDecision d = decide_register(state, true, kNow);
        EXPECT_EQ(d.outcome, Outcome::Mismatch);
        EXPECT_EQ(d.action, ClaimAction::Answer);
        EXPECT_FALSE(d.retry_after.has_value());
    }
}

TEST(DecideRegister, NeverChangesAnExistingKey) {
    for (const KeyState& state : sample_states()) {
        for (bool conflict : {false, true}) {
            const ClaimDecision d = decide_register(state, conflict, kNow);
            EXPECT_EQ(d.action, ClaimAction::Answer);
            EXPECT_FALSE(claim_may_change(d));
            EXPECT_FALSE(d.takeover);
            // registered is only for a key register created; claimed and
            // retry_later are claim's answers.
            EXPECT_NE(d.outcome, Outcome::Registered);
            EXPECT_NE(d.outcome, Outcome::Claimed);
            EXPECT_NE(d.outcome, Outcome::RetryLater);
            // retry_after for every in_progress and for nothing else (the queued
            // RECEIVED key has zero left: see ReceivedIsInProgressAndQueued).
            const bool waits = d.outcome == Outcome::InProgress;
            EXPECT_EQ(d.retry_after.has_value(), waits) << status_label(state.status);
            if (d.retry_after) {
                EXPECT_GE(*d.retry_after, 0);
            }
        }
    }
}

TEST(DecideRegister, EveryStatusMapsToTheSpecOutcome) {
    // RECEIVED/PROCESSING/FAILED_RETRYABLE -> in_progress, COMPLETED ->
    // completed, FAILED_FINAL -> failed.
    for (Status status : kAllStatuses) {
        SCOPED_TRACE(status_label(status));
        KeyState state = key(status);
        const ClaimDecision d = decide_register(state, false, kNow);
        switch (status) {
            case Status::Received:
            case Status::Processing:
            case Status::FailedRetryable: EXPECT_EQ(d.outcome, Outcome::InProgress); break;
            case Status::Completed: EXPECT_EQ(d.outcome, Outcome::Completed); break;
            case Status::FailedFinal: EXPECT_EQ(d.outcome, Outcome::Failed); break;
        }
    }
}


// --------------------------------------------------------- decide_expired

TEST(DecideExpired, ATombstoneOfACompletedKeyAnswersCompletedAndChangesNothing) {
    const ClaimDecision d = decide_expired(Status::Completed, false);
    EXPECT_EQ(d.outcome, Outcome::Completed);
    EXPECT_EQ(d.action, ClaimAction::Answer);
    EXPECT_FALSE(d.retry_after.has_value());
    EXPECT_FALSE(claim_may_change(d));
}

TEST(DecideExpired, ATombstoneOfAFinalFailureAnswersFailed) {
    const ClaimDecision d = decide_expired(Status::FailedFinal, false);
    EXPECT_EQ(d.outcome, Outcome::Failed);
    EXPECT_EQ(d.action, ClaimAction::Answer);
}

TEST(DecideExpired, AnotherRequestIsAMismatchWhateverTheKeyFinishedAs) {
    for (Status status : {Status::Completed, Status::FailedFinal}) {
        const ClaimDecision d = decide_expired(status, true);
        EXPECT_EQ(d.outcome, Outcome::Mismatch);
        EXPECT_EQ(d.action, ClaimAction::Answer);
    }
}

}  // namespace
}  // namespace idem
