// idem-relay's exit statuses.
#pragma once

namespace idem::relay {

constexpr int kExitOk = 0;           // success, including a stop on SIGTERM/SIGINT
constexpr int kExitFailure = 1;      // a runtime failure: the relay could not do its work
constexpr int kExitUsage = 2;        // a bad command line
constexpr int kExitDeadLetters = 3;  // --once: the run finished, but events went dead in it

}  // namespace idem::relay
