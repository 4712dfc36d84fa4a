#include "pg/waiting/prepared_wakeups.hpp"

#include <cstring>

#include "pg/boundary/prepared_end.hpp"
#include "pg/waiting/waiter_table.hpp"

extern "C" {
#include "access/twophase.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

constexpr const char* kTrancheName = "idempotency prepared wake-ups";

struct ParkedWakeup {
    TransactionId xid;  // invalid: a free entry
    std::uint64_t channel;
};

struct ParkedWakeups {
    pg_atomic_uint32 used;  // entries taken: 0 lets every COMMIT PREPARED pass at once
    int capacity;
    ParkedWakeup entries[FLEXIBLE_ARRAY_MEMBER];
};

ParkedWakeups* parked = nullptr;
LWLock* lock = nullptr;

int capacity() { return max_prepared_xacts * kParkedPerPrepared; }

// The distinct transactions with parked wake-ups (at most one per entry).
int parked_transactions(TransactionId* xids) {
    int count = 0;
    LWLockAcquire(lock, LW_SHARED);
    for (int i = 0; i < parked->capacity; ++i) {
        const TransactionId xid = parked->entries[i].xid;
        if (!TransactionIdIsValid(xid)) continue;
        bool listed = false;
        for (int x = 0; x < count && !listed; ++x) listed = xids[x] == xid;
        if (!listed) xids[count++] = xid;
    }
    LWLockRelease(lock);
    return count;
}

// Frees the entries of `xid`; returns the channels of those it frees, up
// to `most` of them (the rest stay, for the next call).
int take_entries(TransactionId xid, std::uint64_t* channels, int most) {
    int count = 0;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    for (int i = 0; i < parked->capacity && count < most; ++i) {
        ParkedWakeup& entry = parked->entries[i];
        if (entry.xid != xid) continue;
        channels[count++] = entry.channel;
        entry.xid = InvalidTransactionId;
        pg_atomic_fetch_sub_u32(&parked->used, 1);
    }
    LWLockRelease(lock);
    return count;
}

// The wake-ups of prepared transactions that have ended: a committed one's
// are given, a rolled-back one's dropped. Any session may give any's. Whether
// a transaction ended is asked outside the lock, once per transaction.
void give_ended() {
    if (parked == nullptr || pg_atomic_read_u32(&parked->used) == 0) return;
    auto* xids = static_cast<TransactionId*>(palloc(sizeof(TransactionId) * parked->capacity));
    std::uint64_t channels[kParkedPerPrepared];
    const int count = parked_transactions(xids);
    for (int x = 0; x < count; ++x) {
        if (TransactionIdIsInProgress(xids[x])) continue;
        const bool committed = TransactionIdDidCommit(xids[x]);
        // A transaction parks at most kParkedPerPrepared: one take frees all.
        const int taken = take_entries(xids[x], channels, kParkedPerPrepared);
        // Outside the lock: a signal takes the waiter table's own locks.
        if (committed)
            for (int i = 0; i < taken; ++i) (void)signal_waiters(channels[i]);
    }
    pfree(xids);
}

}  // namespace

Size prepared_wakeups_size() {
    return add_size(offsetof(ParkedWakeups, entries),
                    mul_size(sizeof(ParkedWakeup), static_cast<Size>(capacity())));
}

void request_prepared_wakeups_lock() { RequestNamedLWLockTranche(kTrancheName, 1); }

// Under AddinShmemInitLock, from the startup hook.
void init_prepared_wakeups() {
    bool found = false;
    parked = static_cast<ParkedWakeups*>(
        ShmemInitStruct("idempotency prepared wake-ups", prepared_wakeups_size(), &found));
    if (!found) {
        std::memset(static_cast<void*>(parked), 0, prepared_wakeups_size());
        pg_atomic_init_u32(&parked->used, 0);
        parked->capacity = capacity();
    }
    lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
}

void park_wakeups(TransactionId xid, const std::uint64_t* channels, int count) {
    if (parked == nullptr || count == 0 || !TransactionIdIsValid(xid)) return;
    // The first distinct channels (a key freed twice is woken once), before
    // the lock is taken.
    std::uint64_t distinct[kParkedPerPrepared];
    int limit = 0;
    for (int c = 0; c < count && limit < kParkedPerPrepared; ++c) {
        bool seen = false;
        for (int d = 0; d < limit && !seen; ++d) seen = distinct[d] == channels[c];
        if (!seen) distinct[limit++] = channels[c];
    }
    LWLockAcquire(lock, LW_EXCLUSIVE);
    for (int i = 0, next = 0; i < parked->capacity && next < limit; ++i) {
        ParkedWakeup& entry = parked->entries[i];
        if (TransactionIdIsValid(entry.xid)) continue;
        entry.xid = xid;
        entry.channel = distinct[next++];
        pg_atomic_fetch_add_u32(&parked->used, 1);
    }
    LWLockRelease(lock);
}

void install_prepared_wakeups() { after_prepared_ends(give_ended); }

}  // namespace idem::pg
