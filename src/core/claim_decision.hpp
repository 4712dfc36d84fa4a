// Where a claim or a register is decided: given the stored key (if any),
// what the call answers and which transition, if any, it makes.
#pragma once

#include "core/key_state.hpp"

namespace idem {

enum class ClaimAction {
    Answer,         // read-only: report the stored state
    Grant,          // PROCESSING with a new token and lease
    ExpireToFinal,  // lease expired with attempts exhausted: FAILED_FINAL
};

struct ClaimDecision {
    Outcome outcome;
    ClaimAction action;
    std::optional<Micros> retry_after;  // for in_progress and retry_later
    bool takeover = false;              // the grant ends someone else's expired lease
};

// `fingerprint_conflict`: both the stored and the given fingerprint exist and differ.
// `max_attempts` is the caller's cap, for a key whose claim recorded none.
ClaimDecision decide_claim(const KeyState& key, bool fingerprint_conflict, Micros now,
                           int max_attempts);

// idem_register never changes an existing key; it only reports it.
ClaimDecision decide_register(const KeyState& key, bool fingerprint_conflict, Micros now);

// A claim or register of a key that is gone but for its tombstone (its
// result's retention passed): `final_status` is what the key finished as.
// It is never created again: the answer is the outcome of that status
// (completed, or failed), or a mismatch, and changes nothing.
ClaimDecision decide_expired(Status final_status, bool fingerprint_conflict);

// True when a claim may need to change the key: such a claim locks the row and
// decides again on what it then reads. Every other answer comes from a plain read.
bool claim_may_change(const ClaimDecision& decision);

}  // namespace idem
