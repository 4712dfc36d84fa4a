// Where a holder's call is checked against the key: the fencing rules of
// complete, fail, heartbeat, release, assert_owner and step.
#pragma once

#include <cstdint>

#include "core/key_state.hpp"

namespace idem {

// Step: the record of a finished step of multi-step work (idem_step).
enum class HolderCall { Complete, Fail, Heartbeat, Release, AssertOwner, Step };

enum class FenceVerdict {
    Proceed,           // the call may make its transition
    AlreadyCompleted,  // complete repeated by the completing token: replay, change nothing
    StaleToken,        // IK001
    WrongState,        // IK003
};

// Only a PROCESSING key's holder may fail, heartbeat, release or assert it.
// A holder whose lease expired keeps its token until the key is claimed
// again; until then its complete still counts, and so do the steps it
// records (nothing else it does). A step is fenced as complete is, but a
// step after the complete is refused (WrongState), never replayed.
FenceVerdict check_fence(HolderCall call, const KeyState& key, std::int64_t token);

// The SQLSTATE and the words for a verdict that refuses the call.
const char* fence_sqlstate(FenceVerdict verdict);

}  // namespace idem
