#include "pg/waiting/prepared_wakeups.hpp"

#include <cstring>

#include "pg/waiting/waiter_table.hpp"

extern "C" {
#include "access/twophase.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
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
ProcessUtility_hook_type previous_hook = nullptr;

int capacity() { return max_prepared_xacts * kParkedPerPrepared; }

// The wake-ups of prepared transactions that have ended: a committed one's
// are given, a rolled-back one's dropped. Any session may give any's.
void give_ended() {
    if (parked == nullptr || pg_atomic_read_u32(&parked->used) == 0) return;
    constexpr int kBatch = 64;
    std::uint64_t channels[kBatch];
    for (bool more = true; more;) {
        int count = 0;
        more = false;
        LWLockAcquire(lock, LW_EXCLUSIVE);
        for (int i = 0; i < parked->capacity; ++i) {
            ParkedWakeup& entry = parked->entries[i];
            if (!TransactionIdIsValid(entry.xid) || TransactionIdIsInProgress(entry.xid)) continue;
            if (count == kBatch) {
                more = true;
                break;
            }
            if (TransactionIdDidCommit(entry.xid)) channels[count++] = entry.channel;
            entry.xid = InvalidTransactionId;
            pg_atomic_fetch_sub_u32(&parked->used, 1);
        }
        LWLockRelease(lock);
        // Outside the lock: a signal takes the waiter table's own locks.
        for (int i = 0; i < count; ++i) (void)signal_waiters(channels[i]);
    }
}

bool ends_prepared(const Node* statement) {
    if (!IsA(statement, TransactionStmt)) return false;
    const auto kind = reinterpret_cast<const TransactionStmt*>(statement)->kind;
    return kind == TRANS_STMT_COMMIT_PREPARED || kind == TRANS_STMT_ROLLBACK_PREPARED;
}

void process_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                     ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                     DestReceiver* dest, QueryCompletion* completion) {
    if (previous_hook != nullptr)
        previous_hook(statement, query, read_only_tree, context, params, env, dest, completion);
    else
        standard_ProcessUtility(statement, query, read_only_tree, context, params, env, dest,
                                completion);
    // The prepared transaction's commit is visible now (an error would not
    // reach here): its waiters look again.
    if (ends_prepared(statement->utilityStmt)) give_ended();
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
    const int limit = count < kParkedPerPrepared ? count : kParkedPerPrepared;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    for (int i = 0, next = 0; i < parked->capacity && next < limit; ++i) {
        ParkedWakeup& entry = parked->entries[i];
        if (TransactionIdIsValid(entry.xid)) continue;
        entry.xid = xid;
        entry.channel = channels[next++];
        pg_atomic_fetch_add_u32(&parked->used, 1);
    }
    LWLockRelease(lock);
}

void install_prepared_wakeups_hook() {
    previous_hook = ProcessUtility_hook;
    ProcessUtility_hook = process_utility;
}

}  // namespace idem::pg
