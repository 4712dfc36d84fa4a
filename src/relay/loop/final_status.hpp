// The exit status of a run (exit_status.hpp), once every lane has ended:
// code is the first lane failure (kExitOk if none), stopped whether a
// signal or a failure stopped it. Logs why --once did not finish cleanly.
#pragma once

#include "relay/observe/stats.hpp"
#include "relay/options.hpp"

namespace idem::relay {

int final_status(const Options& options, const Stats& stats, int code, bool stopped);

}  // namespace idem::relay
