#include "pg/producer_turn.hpp"

extern "C" {
#include "common/hashfn.h"
#include "storage/lock.h"
}

namespace idem::pg {

namespace {

// Advisory lock tags of SQL's pg_advisory_* functions use field4 1 or 2;
// this class keeps the extension's turns apart from the application's.
constexpr uint16 kTurnLockClass = 0x49;
constexpr uint32 kTurnLockSpace = 0x4944454D;  // "IDEM"

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

}  // namespace idem::pg
