// How a holder's call finds its key and checks its token: the core's
// fencing rules (core/fence.hpp) on the key's row, re-decided on its newest
// version when a concurrent change got there first, and the errors of a
// refusal (IK001, IK002, IK003). Used by every call that takes a token:
// pg/keys/holder_functions.cpp and pg/keys/step_functions.cpp.
#pragma once

#include <cstdint>

#include "core/fence.hpp"
#include "pg/keys/key_store.hpp"

namespace idem::pg {

// Checks the holder's token on the key read. Returns the verdict when it
// lets the call go on (Proceed, or AlreadyCompleted for complete). Any
// other answer is given on the key's newest version, locked; a refusal
// closes `row` and raises.
FenceVerdict check_as_holder(HolderCall call, const KeyId& id, std::int64_t token,
                             StoredKey* stored, KeyRow* row);

// Finds the key for a holder's call (locked at once when `lock`, else as
// UPDATE finds it) and checks the token; IK002 when it does not exist.
FenceVerdict find_as_holder(HolderCall call, const KeyId& id, std::int64_t token, bool lock,
                            StoredKey* stored, KeyRow* row);

// After a change that did not happen: Again means the row changed
// concurrently (its newest version, locked, is decided on again); any
// other answer ends the call.
FenceVerdict after_change(Change change, HolderCall call, const KeyId& id, std::int64_t token,
                          StoredKey* stored, KeyRow* row);

}  // namespace idem::pg
