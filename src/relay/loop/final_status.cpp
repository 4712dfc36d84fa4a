#include "relay/loop/final_status.hpp"

#include "relay/loop/exit_status.hpp"
#include "relay/observe/log.hpp"

namespace idem::relay {

int final_status(const Options& options, const Stats& stats, int code, bool stopped) {
    if (code != 0 || !options.once || stopped) return code;
    if (stats.not_attempted.load() > 0) {
        log_error("%llu due event(s) were not attempted and are left to their lease (the "
                  "extension has no outbox_release, or it failed): not everything due was "
                  "delivered",
                  static_cast<unsigned long long>(stats.not_attempted.load()));
        return kExitFailure;
    }
    if (stats.dead.load() > 0) {
        log_error("%llu event(s) went dead in this run (see idempotency.outbox_dead_letters)",
                  static_cast<unsigned long long>(stats.dead.load()));
        return kExitDeadLetters;
    }
    return kExitOk;
}

}  // namespace idem::relay
