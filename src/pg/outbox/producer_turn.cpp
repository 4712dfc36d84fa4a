#include "pg/outbox/producer_turn.hpp"

extern "C" {
#include "common/hashfn.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

// Advisory lock tags of SQL's pg_advisory_* functions use field4 1 or 2;
// this class keeps the extension's turns apart from the application's.
constexpr uint16 kTurnLockClass = 0x49;
constexpr uint32 kTurnLockSpace = 0x4944454D;  // "IDEM"

// Commit counts go up by 2; the low bit is a prepared transaction's mark.
constexpr std::uint64_t kStep = 2;
constexpr std::uint64_t kPreparedMark = 1;

struct TurnCounts {
    pg_atomic_uint64 count[kProducerTurns];
};

TurnCounts* counts = nullptr;

uint32 hash_of(const text* value) {
    return hash_bytes(reinterpret_cast<const unsigned char*>(VARDATA_ANY(value)),
                      static_cast<int>(VARSIZE_ANY_EXHDR(value)));
}

}  // namespace

std::uint32_t producer_turn_of(const text* topic, const text* key) {
    return hash_combine(hash_of(topic), hash_of(key)) % kProducerTurns;
}

void take_producer_turn(std::uint32_t turn) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kTurnLockSpace, turn, kTurnLockClass);
    (void)LockAcquire(&tag, ExclusiveLock, false, false);
}

void take_producer_turn(const text* topic, const text* key) {
    take_producer_turn(producer_turn_of(topic, key));
}

std::uint64_t turn_count(std::uint32_t turn) {
    if (counts == nullptr) return kNoCount;
    // Read before whatever the caller reads next (a snapshot).
    const std::uint64_t value = pg_atomic_read_u64(&counts->count[turn]);
    pg_memory_barrier();
    return value;
}

bool turn_unchanged(std::uint32_t turn, std::uint64_t seen) {
    if (counts == nullptr || seen == kNoCount) return false;
    const std::uint64_t now = pg_atomic_read_u64(&counts->count[turn]);
    if (now & kPreparedMark) {
        // The prepared transaction has ended: its turn is held by the caller.
        (void)pg_atomic_fetch_and_u64(&counts->count[turn], ~kPreparedMark);
        return false;
    }
    return now == seen;
}

void turns_committed(const std::uint32_t* turns, int count) {
    if (counts == nullptr) return;
    for (int i = 0; i < count; ++i) (void)pg_atomic_fetch_add_u64(&counts->count[turns[i]], kStep);
}

void turns_prepared(const std::uint32_t* turns, int count) {
    if (counts == nullptr) return;
    for (int i = 0; i < count; ++i) {
        (void)pg_atomic_fetch_add_u64(&counts->count[turns[i]], kStep);
        (void)pg_atomic_fetch_or_u64(&counts->count[turns[i]], kPreparedMark);
    }
}

Size producer_turn_size() { return MAXALIGN(sizeof(TurnCounts)); }

void init_producer_turns() {
    bool found = false;
    counts = static_cast<TurnCounts*>(ShmemInitStruct("idempotency turn counts", sizeof(TurnCounts), &found));
    if (!found)
        for (auto& count : counts->count) pg_atomic_init_u64(&count, 0);
}

}  // namespace idem::pg
