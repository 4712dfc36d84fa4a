#include "pg/stats/durations.hpp"

#include <algorithm>
#include <cstring>

#include "core/validate.hpp"
#include "pg/boundary/settings.hpp"

extern "C" {
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
}

namespace idem::pg {

namespace {

constexpr char kTrancheName[] = "idempotency durations";

struct ScopeKey {
    Oid database;
    char scope[kMaxNameBytes + 1];  // zero-padded: keys compare as bytes
};

// The lock guards the table's entries (shared to find one, exclusive to add
// one); each entry's spinlock guards its estimate.
struct ScopeDurations {
    ScopeKey key;
    slock_t mutex;
    DurationEstimate estimate;
};

LWLock* lock = nullptr;
HTAB* scopes = nullptr;

long capacity() { return settings::max_gauges; }

void make_key(ScopeKey* key, const text* scope) {
    std::memset(key, 0, sizeof *key);
    key->database = MyDatabaseId;
    std::memcpy(key->scope, VARDATA_ANY(scope),
                std::min<std::size_t>(VARSIZE_ANY_EXHDR(scope), kMaxNameBytes));
}

}  // namespace

void note_completion(const text* scope, Micros duration) {
    if (lock == nullptr || scope == nullptr) return;
    ScopeKey key;
    make_key(&key, scope);
    LWLockAcquire(lock, LW_SHARED);
    auto* entry = static_cast<ScopeDurations*>(hash_search(scopes, &key, HASH_FIND, nullptr));
    if (entry == nullptr) {
        LWLockRelease(lock);
        LWLockAcquire(lock, LW_EXCLUSIVE);
        bool found = false;
        entry = static_cast<ScopeDurations*>(hash_search(scopes, &key, HASH_ENTER_NULL, &found));
        if (entry != nullptr && !found) {
            SpinLockInit(&entry->mutex);
            entry->estimate = DurationEstimate{};
        }
    }
    if (entry != nullptr) {
        SpinLockAcquire(&entry->mutex);
        entry->estimate = observe_duration(entry->estimate, duration);
        SpinLockRelease(&entry->mutex);
    }
    LWLockRelease(lock);
}

std::optional<DurationEstimate> completion_estimate(const text* scope) {
    if (lock == nullptr || scope == nullptr) return std::nullopt;
    ScopeKey key;
    make_key(&key, scope);
    std::optional<DurationEstimate> estimate;
    LWLockAcquire(lock, LW_SHARED);
    if (auto* entry = static_cast<ScopeDurations*>(hash_search(scopes, &key, HASH_FIND, nullptr))) {
        SpinLockAcquire(&entry->mutex);
        estimate = entry->estimate;
        SpinLockRelease(&entry->mutex);
    }
    LWLockRelease(lock);
    return estimate;
}

Size durations_size() { return hash_estimate_size(capacity(), sizeof(ScopeDurations)); }

void request_durations_lock() { RequestNamedLWLockTranche(kTrancheName, 1); }

// Under AddinShmemInitLock, from the startup hook.
void init_durations() {
    HASHCTL control;
    std::memset(&control, 0, sizeof control);
    control.keysize = sizeof(ScopeKey);
    control.entrysize = sizeof(ScopeDurations);
    scopes = ShmemInitHash("idempotency durations", capacity(), capacity(), &control,
                           HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
    lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
}

}  // namespace idem::pg
