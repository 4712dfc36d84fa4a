// Waiting for someone else: a short, interruptible sleep used by callers
// that poll (claim and lock with `wait`).
#pragma once

#include "core/time.hpp"

namespace idem::pg {

// Sleeps for the given poll round's interval (growing from 1 ms to 50 ms),
// never past `deadline`; reacts to query cancel and postmaster death.
void pause_before_retry(int round, Micros deadline);

}  // namespace idem::pg
