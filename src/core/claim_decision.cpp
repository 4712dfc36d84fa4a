#include "core/claim_decision.hpp"

#include <algorithm>
#include "core/cpp_only.hpp"
#include "core/retry.hpp"

namespace idem {

namespace {

ClaimDecision answer(Outcome outcome, std::optional<Micros> retry_after = std::nullopt) {
    return ClaimDecision{outcome, ClaimAction::Answer, retry_after, false};
}

Micros time_left(std::optional<Micros> until, Micros now) {
    return until ? std::max<Micros>(0, *until - now) : 0;
}

}  // namespace

ClaimDecision decide_claim(const KeyState& key, bool fingerprint_conflict, Micros now,
                           int max_attempts) {
    if (fingerprint_conflict) return answer(Outcome::Mismatch);
    switch (key.status) {
        case Status::Received:
            return ClaimDecision{Outcome::Claimed, ClaimAction::Grant, std::nullopt, false};
        case Status::Processing:
            if (key.lease_until && *key.lease_until > now)
                return answer(Outcome::InProgress, *key.lease_until - now);
            if (!attempts_left(key.attempts, key.max_attempts, max_attempts))
                return ClaimDecision{Outcome::Failed, ClaimAction::ExpireToFinal, std::nullopt, false};
            return ClaimDecision{Outcome::Claimed, ClaimAction::Grant, std::nullopt, true};
        case Status::Completed:
            return answer(Outcome::Completed);
        case Status::FailedRetryable:
            if (key.next_attempt_at && *key.next_attempt_at > now)
                return answer(Outcome::RetryLater, *key.next_attempt_at - now);
            return ClaimDecision{Outcome::Claimed, ClaimAction::Grant, std::nullopt, false};
        case Status::FailedFinal:
            return answer(Outcome::Failed);
    }
    return answer(Outcome::Failed);
}

ClaimDecision decide_register(const KeyState& key, bool fingerprint_conflict, Micros now) {
    if (fingerprint_conflict) return answer(Outcome::Mismatch);
    switch (key.status) {
        case Status::Received:
            return answer(Outcome::InProgress, 0);  // queued: no lease left to wait for
        case Status::Processing:
            return answer(Outcome::InProgress, time_left(key.lease_until, now));
        case Status::FailedRetryable:
            return answer(Outcome::InProgress, time_left(key.next_attempt_at, now));
        case Status::Completed:
            return answer(Outcome::Completed);
        case Status::FailedFinal:
            return answer(Outcome::Failed);
    }
    return answer(Outcome::Failed);
}

ClaimDecision decide_expired(Status final_status, bool fingerprint_conflict) {
    if (fingerprint_conflict) return answer(Outcome::Mismatch);
    return answer(final_status == Status::Completed ? Outcome::Completed : Outcome::Failed);
}

bool claim_may_change(const ClaimDecision& decision) {
    return decision.action != ClaimAction::Answer;
}

}  // namespace idem
