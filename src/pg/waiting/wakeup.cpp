#include "pg/waiting/wakeup.hpp"

#include <sched.h>

#include <algorithm>

#include "pg/boundary/guard.hpp"
#include "pg/waiting/prepared_wakeups.hpp"
#include "pg/waiting/waiter_table.hpp"

extern "C" {
#include "common/hashfn.h"
#include "utils/memutils.h"
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

// The (sub)transaction nesting level this session registered at: an error
// that aborts it (or an outer one) ends the wait; the module's own
// subtransactions inside a wait (rolled back after waiting for a lock) do not.
int registered_level = 0;

// Channels to signal at commit, kept in TopMemoryContext (grown as needed).
std::uint64_t* pending = nullptr;
int pending_count = 0;
int pending_capacity = 0;

void forget_pending() { pending_count = 0; }

// The transaction being prepared (read before PREPARE ends it).
TransactionId preparing_xid = InvalidTransactionId;

void on_transaction_end(XactEvent event, void*) {
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
        if (pending_count == 0) return;
        int signalled = 0;
        for (int i = 0; i < pending_count; ++i) signalled += signal_waiters(pending[i]);
        // What the commit cost its session, whatever waits: at most kFanOut
        // signals per key or lock it freed.
        if (signalled > 0)
            elog(DEBUG1, "idempotency: the commit signalled %d waiting session(s) for %d key(s)",
                 signalled, pending_count);
        forget_pending();
    } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) {
        // An error while waiting leaves the table (handing on a wake-up).
        unregister_waiter();
        forget_pending();
    } else if (event == XACT_EVENT_PRE_PREPARE) {
        preparing_xid = GetTopTransactionIdIfAny();
    } else if (event == XACT_EVENT_PREPARE) {
        // Given by the session that runs COMMIT PREPARED.
        park_wakeups(preparing_xid, pending, pending_count);
        forget_pending();
    }
}

void on_subtransaction_end(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    if (event == SUBXACT_EVENT_ABORT_SUB && GetCurrentTransactionNestLevel() <= registered_level)
        unregister_waiter();
}

std::uint64_t hash_text(const text* value, std::uint64_t seed) {
    if (value == nullptr) return seed;
    return hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(value)),
                               static_cast<int>(VARSIZE_ANY_EXHDR(value)), seed);
}

}  // namespace

std::uint64_t wake_channel(WaitTopic topic, std::initializer_list<const text*> names) {
    std::uint64_t hash = static_cast<std::uint64_t>(topic);
    for (const text* name : names) hash = hash_text(name, hash);
    return hash == 0 ? 1 : hash;
}

void prepare_to_wait(std::uint64_t channel) {
    registered_level = GetCurrentTransactionNestLevel();
    register_waiter(channel);
}

void wait_for_wakeup(Micros until, int round) {
    if (!waiter_table_present()) {
        pause_before_retry(round, until);
        return;
    }
    const Micros left = until - GetCurrentTimestamp();
    const long timeout_ms =
        static_cast<long>(std::max<Micros>(1, (left + kMillisecond - 1) / kMillisecond));
    // A signal that came while the caller looked (its latch set, perhaps
    // reset by another wait since) needs no sleep; nor does a session no
    // longer registered (it looks again, registered).
    if (!waiter_signalled() && waiter_registered())
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                        PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    if (waiter_signalled()) {
        elog(DEBUG2, "idempotency: woken by a commit of what this session waits for");
        // The committing session, and the sessions woken before, go first:
        // a crowd woken at once must not hold up the commit that woke it.
        sched_yield();
        hand_on_wakeup();
    }
}

void stop_waiting() { unregister_waiter(); }

void hand_on_received_wakeup() { hand_on_wakeup(); }

void wake_on_commit(std::uint64_t channel) {
    if (!waiter_table_present()) return;
    if (pending_count > 0 && pending[pending_count - 1] == channel) return;
    if (pending_count == pending_capacity) {
        const int capacity = std::max(16, pending_capacity * 2);
        pending = static_cast<std::uint64_t*>(
            pending == nullptr
                ? MemoryContextAlloc(TopMemoryContext, sizeof(std::uint64_t) * capacity)
                : repalloc(pending, sizeof(std::uint64_t) * capacity));
        pending_capacity = capacity;
    }
    pending[pending_count++] = channel;
}

void install_wakeup_callbacks() {
    register_guarded_callback(on_transaction_end);
    register_guarded_callback(on_subtransaction_end);
}

}  // namespace idem::pg
