#include "pg/shmem/wakeup.hpp"

#include <algorithm>

#include "pg/boundary/guard.hpp"
#include "pg/shmem/shared_state.hpp"

extern "C" {
#include "common/hashfn.h"
}

namespace idem::pg {

namespace {

// Without preload there is nothing to wait on: a short, interruptible
// sleep, growing from 1 ms to 50 ms by round, never past `deadline`.
void pause_before_retry(int round, Micros deadline) {
    const Micros step = std::min<Micros>(50, 1 << std::min(round, 6)) * kMillisecond;
    const Micros left = deadline - GetCurrentTimestamp();
    const long timeout_ms = static_cast<long>(std::max<Micros>(1, std::min(step, left) / kMillisecond));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}

// Channels to broadcast at commit; past the limit every channel is woken.
constexpr int kMaxPending = 64;
std::uint32_t pending[kMaxPending];
int pending_count = 0;
bool wake_everything = false;

ConditionVariable* channel_cv(SharedState* shared, std::uint32_t channel) {
    return &shared->wake[channel % kWakeSlots];
}

void on_transaction_end(XactEvent event, void*) {
    if (pending_count == 0 && !wake_everything) return;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
        if (SharedState* shared = shared_state()) {
            if (wake_everything)
                for (auto& cv : shared->wake) ConditionVariableBroadcast(&cv);
            else
                for (int i = 0; i < pending_count; ++i)
                    ConditionVariableBroadcast(channel_cv(shared, pending[i]));
        }
    } else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
               event != XACT_EVENT_PREPARE) {
        return;
    }
    pending_count = 0;
    wake_everything = false;
}

std::uint32_t hash_text(const text* value, std::uint32_t seed) {
    if (value == nullptr) return seed;
    return hash_combine(seed, hash_bytes(reinterpret_cast<const unsigned char*>(VARDATA_ANY(value)),
                                         static_cast<int>(VARSIZE_ANY_EXHDR(value))));
}

}  // namespace

std::uint32_t wake_channel(WaitTopic topic, const text* first, const text* second) {
    return hash_text(second, hash_text(first, static_cast<std::uint32_t>(topic)));
}

void prepare_to_wait(std::uint32_t channel) {
    if (SharedState* shared = shared_state()) ConditionVariablePrepareToSleep(channel_cv(shared, channel));
}

void wait_for_wakeup(std::uint32_t channel, Micros until, int round) {
    SharedState* shared = shared_state();
    if (shared == nullptr) {
        pause_before_retry(round, until);
        return;
    }
    const Micros left = until - GetCurrentTimestamp();
    const long timeout_ms = static_cast<long>(std::max<Micros>(1, (left + kMillisecond - 1) / kMillisecond));
    (void)ConditionVariableTimedSleep(channel_cv(shared, channel), timeout_ms, PG_WAIT_EXTENSION);
}

void stop_waiting() {
    if (shared_state() != nullptr) ConditionVariableCancelSleep();
}

void wake_on_commit(std::uint32_t channel) {
    if (shared_state() == nullptr || wake_everything) return;
    for (int i = 0; i < pending_count; ++i)
        if (pending[i] % kWakeSlots == channel % kWakeSlots) return;
    if (pending_count == kMaxPending)
        wake_everything = true;
    else
        pending[pending_count++] = channel;
}

void install_wakeup_callbacks() { register_guarded_callback(on_transaction_end); }

}  // namespace idem::pg
