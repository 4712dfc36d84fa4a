// SIGTERM, SIGINT and SIGHUP ask the relay to stop gracefully (counted: a
// second one hurries it). SIGHUP reloads nothing: the relay reads its
// settings once, so a hangup (a closed terminal, a service manager's reload)
// is a stop like SIGTERM, and a supervisor starts it again with the new
// settings. SIGPIPE is ignored (a closed sink is an error, not a death).
#pragma once

#include <vector>

#include "relay/wake.hpp"

namespace idem::relay {

// Installs the handlers; each signal also wakes these pipes (one per lane,
// at most 16) until forget_wake_pipes().
void install_signal_handlers(const std::vector<const WakePipe*>& wakes);
// Before the pipes are destroyed: a late signal is still counted, and wakes
// nothing. Call from the thread the signals are delivered to.
void forget_wake_pipes();

// How many SIGTERM/SIGINT/SIGHUP arrived so far.
int stop_requests();

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (call before starting
// helper threads, which inherit it) or unblocks them again.
void block_stop_signals(bool block);

}  // namespace idem::relay
