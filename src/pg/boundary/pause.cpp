#include "pg/boundary/pause.hpp"

#include <algorithm>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

void pause_before_retry(int round, Micros deadline) {
    const Micros step = std::min<Micros>(50, 1 << std::min(round, 6)) * kMillisecond;
    const Micros left = deadline - GetCurrentTimestamp();
    const long timeout_ms = static_cast<long>(std::max<Micros>(1, std::min(step, left) / kMillisecond));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}

}  // namespace idem::pg
