// check_fence against the state machine: only the holder of the current
// token may complete, fail, heartbeat or release a PROCESSING key; the late
// holder whose lease expired while nobody claimed again may only complete;
// complete's idempotent replay, IK001 vs IK003, idem_assert_owner, and
// idem_step (fenced as complete, but never replayed after it).
#include "core/fence.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace idem {
namespace {

constexpr std::int64_t kToken = 1000;

constexpr HolderCall kAllCalls[] = {HolderCall::Complete, HolderCall::Fail, HolderCall::Heartbeat,
                                    HolderCall::Release, HolderCall::AssertOwner,
                                    HolderCall::Step};
constexpr Status kAllStatuses[] = {Status::Received, Status::Processing, Status::Completed,
                                   Status::FailedRetryable, Status::FailedFinal};

const char* call_name(HolderCall call) {
    switch (call) {
        case HolderCall::Complete: return "complete";
        case HolderCall::Fail: return "fail";
        case HolderCall::Heartbeat: return "heartbeat";
        case HolderCall::Release: return "release";
        case HolderCall::AssertOwner: return "assert_owner";
        case HolderCall::Step: return "step";
    }
    return "?";
}

KeyState key(Status status, bool lease_expired, std::optional<std::int64_t> token = kToken) {
    KeyState state;
    state.status = status;
    state.token = token;
    state.attempts = 1;
    state.lease_expired = lease_expired;
    return state;
}

using V = FenceVerdict;
constexpr V P = V::Proceed;
constexpr V A = V::AlreadyCompleted;
constexpr V S = V::StaleToken;
constexpr V W = V::WrongState;

// The verdict for the holder of the CURRENT token, written out from the
// state machine for every call x status x lease_expired (the flag is set only when the
// lease ran out under the holder, by a worker or a claim that found it
// exhausted: the key is then FAILED_RETRYABLE or FAILED_FINAL).
struct Row {
    Status status;
    bool lease_expired;
    V complete, fail, heartbeat, release, assert_owner, step;
};
constexpr Row kCurrentTokenTable[] = {
    //                                      complete fail hb release assert step
    // RECEIVED: nobody holds a lease (a current token here would be a bug elsewhere).
    {Status::Received, false,               W, W, W, W, S, W},
    {Status::Received, true,                W, W, W, W, S, W},
    // PROCESSING: the holder does everything, live lease or expired but not yet
    // swept ("a late complete whose lease expired but whose token is still current").
    {Status::Processing, false,             P, P, P, P, P, P},
    {Status::Processing, true,              P, P, P, P, P, P},
    // COMPLETED: complete again is a no-op replay; nothing else is allowed
    // (IK003), a step neither: the work is done.
    {Status::Completed, false,              A, W, W, W, S, W},
    {Status::Completed, true,               A, W, W, W, S, W},
    // FAILED_RETRYABLE: reported by the holder itself -> IK003; expired under
    // the holder and nobody claimed since -> only its late complete (and
    // the steps it finished) count: no fail, heartbeat or release moves a
    // key that is not PROCESSING.
    {Status::FailedRetryable, false,        W, W, W, W, S, W},
    {Status::FailedRetryable, true,         P, W, W, W, S, P},
    // FAILED_FINAL: a complete after a final failure the holder reported
    // itself is IK003; after an exhausted expiry the late complete counts.
    {Status::FailedFinal, false,            W, W, W, W, S, W},
    {Status::FailedFinal, true,             P, W, W, W, S, P},
};

V expected_for(const Row& row, HolderCall call) {
    switch (call) {
        case HolderCall::Complete: return row.complete;
        case HolderCall::Fail: return row.fail;
        case HolderCall::Heartbeat: return row.heartbeat;
        case HolderCall::Release: return row.release;
        case HolderCall::AssertOwner: return row.assert_owner;
        case HolderCall::Step: return row.step;
    }
    return S;
}

TEST(CheckFence, TableCoversEveryStatusAndLeaseFlag) {
    int seen[kStatusCount][2] = {};
    for (const Row& row : kCurrentTokenTable) ++seen[static_cast<int>(row.status)][row.lease_expired];
    for (int s = 0; s < kStatusCount; ++s)
        for (int e = 0; e < 2; ++e) EXPECT_EQ(seen[s][e], 1) << "status " << s << " expired " << e;
}

TEST(CheckFence, CurrentTokenEveryCallEveryStatus) {
    for (const Row& row : kCurrentTokenTable) {
        for (HolderCall call : kAllCalls) {
            SCOPED_TRACE(std::string(call_name(call)) + " on " + status_label(row.status) +
                         (row.lease_expired ? " (lease expired)" : " (lease not expired)"));
            EXPECT_EQ(check_fence(call, key(row.status, row.lease_expired), kToken),
                      expected_for(row, call));
        }
    }
}

TEST(CheckFence, StaleTokenIsRefusedEverywhere) {
    // Someone claimed since (a greater token), an older token, or one the key
    // never had: IK001 for every call in every state, expired lease or not.
    for (Status status : kAllStatuses) {
        for (bool expired : {false, true}) {
            for (HolderCall call : kAllCalls) {
                for (std::int64_t token : {kToken - 1, kToken + 1, std::int64_t{0},
                                           std::int64_t{-kToken}, INT64_MAX, INT64_MIN}) {
                    SCOPED_TRACE(std::string(call_name(call)) + " on " + status_label(status) +
                                 " token " + std::to_string(token));
                    EXPECT_EQ(check_fence(call, key(status, expired), token), V::StaleToken);
                }
            }
        }
    }
}

TEST(CheckFence, KeyWithoutTokenRefusesEveryToken) {
    // A registered key never claimed, or one whose claim was released: "The
    // released token is no longer current."
    for (Status status : kAllStatuses) {
        for (HolderCall call : kAllCalls) {
            for (std::int64_t token : {kToken, std::int64_t{0}}) {
                SCOPED_TRACE(std::string(call_name(call)) + " on " + status_label(status));
                EXPECT_EQ(check_fence(call, key(status, false, std::nullopt), token),
                          V::StaleToken);
            }
        }
    }
}

TEST(CheckFence, LateHolderLosesItsTokenOnceTheKeyIsClaimedAgain) {
    // Expired and taken over: the key is PROCESSING again under a new token.
    const KeyState taken_over = key(Status::Processing, false, kToken + 1);
    for (HolderCall call : kAllCalls) {
        SCOPED_TRACE(call_name(call));
        EXPECT_EQ(check_fence(call, taken_over, kToken), V::StaleToken);
        EXPECT_EQ(check_fence(call, taken_over, kToken + 1), V::Proceed);
    }
}

TEST(CheckFence, CompletedKeyRepliesOnlyToTheCompletingToken) {
    EXPECT_EQ(check_fence(HolderCall::Complete, key(Status::Completed, false), kToken),
              V::AlreadyCompleted);
    EXPECT_EQ(check_fence(HolderCall::Complete, key(Status::Completed, false), kToken + 1),
              V::StaleToken);
}

TEST(CheckFence, AssertOwnerNeverSaysWrongState) {
    // "raises IK001 unless the token is current and the key is PROCESSING".
    for (Status status : kAllStatuses)
        for (bool expired : {false, true})
            for (std::int64_t token : {kToken, kToken + 1}) {
                const V v = check_fence(HolderCall::AssertOwner, key(status, expired), token);
                const bool owner = token == kToken && status == Status::Processing;
                EXPECT_EQ(v, owner ? V::Proceed : V::StaleToken) << status_label(status);
            }
}

TEST(CheckFence, OnlyCompleteReplays) {
    for (HolderCall call : kAllCalls) {
        if (call == HolderCall::Complete) continue;
        for (Status status : kAllStatuses)
            for (bool expired : {false, true})
                EXPECT_NE(check_fence(call, key(status, expired), kToken), V::AlreadyCompleted);
    }
}

TEST(FenceSqlstate, RefusalsCarryTheSpecCodes) {
    EXPECT_STREQ(fence_sqlstate(V::StaleToken), "IK001");
    EXPECT_STREQ(fence_sqlstate(V::WrongState), "IK003");
    EXPECT_EQ(std::strlen(fence_sqlstate(V::StaleToken)), 5u);
}

}  // namespace
}  // namespace idem
