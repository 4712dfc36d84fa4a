#include "pg/outbox/prepared_topics.hpp"

#include <cstring>

#include "pg/boundary/prepared_end.hpp"
#include "pg/outbox/notify.hpp"

extern "C" {
#include "access/twophase.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

constexpr const char* kTrancheName = "idempotency prepared topics";

struct ParkedTopics {
    TransactionId xid;  // invalid: a free entry
    Oid database;       // NOTIFY reaches the listeners of one database
    int count;
    bool any;           // more topics than kPreparedTopics: "*"
    char names[kPreparedTopics][kTopicBytes];
};

struct PreparedTopics {
    pg_atomic_uint32 used;  // entries taken: 0 lets every COMMIT PREPARED pass at once
    int capacity;
    ParkedTopics entries[FLEXIBLE_ARRAY_MEMBER];
};

PreparedTopics* parked = nullptr;
LWLock* lock = nullptr;

// The transactions with parked topics in this database (one entry each).
int parked_here(TransactionId* xids) {
    int count = 0;
    LWLockAcquire(lock, LW_SHARED);
    for (int i = 0; i < parked->capacity; ++i) {
        const ParkedTopics& entry = parked->entries[i];
        if (TransactionIdIsValid(entry.xid) && entry.database == MyDatabaseId)
            xids[count++] = entry.xid;
    }
    LWLockRelease(lock);
    return count;
}

// Frees the entry of `xid` into `out`; false when another session took it.
bool take_entry(TransactionId xid, ParkedTopics* out) {
    bool taken = false;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    for (int i = 0; i < parked->capacity && !taken; ++i) {
        ParkedTopics& entry = parked->entries[i];
        if (entry.xid != xid || entry.database != MyDatabaseId) continue;
        *out = entry;
        entry.xid = InvalidTransactionId;
        pg_atomic_fetch_sub_u32(&parked->used, 1);
        taken = true;
    }
    LWLockRelease(lock);
    return taken;
}

// The topics of this database's prepared transactions that have ended: a
// committed one's are notified in the current transaction's commit, a
// rolled-back one's dropped. Whether a transaction ended is asked outside
// the lock.
void notify_ended() {
    if (parked == nullptr || pg_atomic_read_u32(&parked->used) == 0) return;
    auto* xids = static_cast<TransactionId*>(palloc(sizeof(TransactionId) * parked->capacity));
    const int count = parked_here(xids);
    ParkedTopics entry;
    for (int x = 0; x < count; ++x) {
        if (TransactionIdIsInProgress(xids[x])) continue;
        const bool committed = TransactionIdDidCommit(xids[x]);
        if (!take_entry(xids[x], &entry) || !committed) continue;
        for (int i = 0; i < entry.count; ++i) Async_Notify(kOutboxChannel, entry.names[i]);
        if (entry.any) Async_Notify(kOutboxChannel, kAnyTopic);
    }
    pfree(xids);
}

}  // namespace

Size prepared_topics_size() {
    return add_size(offsetof(PreparedTopics, entries),
                    mul_size(sizeof(ParkedTopics), static_cast<Size>(max_prepared_xacts)));
}

void request_prepared_topics_lock() { RequestNamedLWLockTranche(kTrancheName, 1); }

// Under AddinShmemInitLock, from the startup hook.
void init_prepared_topics() {
    bool found = false;
    parked = static_cast<PreparedTopics*>(
        ShmemInitStruct("idempotency prepared topics", prepared_topics_size(), &found));
    if (!found) {
        std::memset(static_cast<void*>(parked), 0, prepared_topics_size());
        pg_atomic_init_u32(&parked->used, 0);
        parked->capacity = max_prepared_xacts;
    }
    lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
}

void park_topics(TransactionId xid, const TopicList& topics, bool overflow) {
    if (parked == nullptr || !TransactionIdIsValid(xid)) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    for (int i = 0; i < parked->capacity; ++i) {
        ParkedTopics& entry = parked->entries[i];
        if (TransactionIdIsValid(entry.xid)) continue;
        entry.xid = xid;
        entry.database = MyDatabaseId;
        entry.count = topics.count < kPreparedTopics ? topics.count : kPreparedTopics;
        entry.any = overflow || topics.count > kPreparedTopics;
        for (int t = 0; t < entry.count; ++t)
            std::memcpy(entry.names[t], topics.names[t], kTopicBytes);
        pg_atomic_fetch_add_u32(&parked->used, 1);
        break;
    }
    LWLockRelease(lock);
}

void install_prepared_topics() { after_prepared_ends(notify_ended); }

}  // namespace idem::pg
