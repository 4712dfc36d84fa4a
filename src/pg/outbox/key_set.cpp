#include "pg/outbox/key_set.hpp"

#include <cstring>

extern "C" {
#include "common/hashfn.h"
}

namespace idem::pg {

namespace {

// The hash table's key: the pair's bytes and their hash. Lookups point at
// the caller's texts; an entered pair points at copies in the set's context.
struct PairRef {
    const char* topic;
    const char* key;
    uint32 topic_len;
    uint32 key_len;
    uint32 hash;
};

uint32 pair_hash(const void* key, Size) { return static_cast<const PairRef*>(key)->hash; }

int pair_compare(const void* a, const void* b, Size) {
    const PairRef* x = static_cast<const PairRef*>(a);
    const PairRef* y = static_cast<const PairRef*>(b);
    if (x->hash != y->hash || x->topic_len != y->topic_len || x->key_len != y->key_len) return 1;
    return std::memcmp(x->topic, y->topic, x->topic_len) != 0 ||
           std::memcmp(x->key, y->key, x->key_len) != 0;
}

PairRef ref_of(const text* topic, const text* key) {
    PairRef ref;
    ref.topic = VARDATA_ANY(topic);
    ref.topic_len = VARSIZE_ANY_EXHDR(topic);
    ref.key = VARDATA_ANY(key);
    ref.key_len = VARSIZE_ANY_EXHDR(key);
    ref.hash = hash_combine(hash_bytes(reinterpret_cast<const unsigned char*>(ref.topic),
                                       static_cast<int>(ref.topic_len)),
                            hash_bytes(reinterpret_cast<const unsigned char*>(ref.key),
                                       static_cast<int>(ref.key_len)));
    return ref;
}

}  // namespace

struct KeySighting {
    PairRef pair;  // the hash key: first member
    bool in_flight_seen;
};

OutboxKeySet make_key_set(MemoryContext context) {
    HASHCTL control;
    std::memset(&control, 0, sizeof(control));
    control.keysize = sizeof(PairRef);
    control.entrysize = sizeof(KeySighting);
    control.hash = pair_hash;
    control.match = pair_compare;
    control.hcxt = context;
    OutboxKeySet set;
    set.context = context;
    set.pairs = hash_create("idempotency outbox claim keys", 256, &control,
                            HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
    return set;
}

KeySighting* meet_key(OutboxKeySet set, const text* topic, const text* key, bool* first) {
    const PairRef ref = ref_of(topic, key);
    bool found = false;
    KeySighting* sighting =
        static_cast<KeySighting*>(hash_search(set.pairs, &ref, HASH_ENTER, &found));
    *first = !found;
    if (!found) {
        // The entry holds the caller's pointers: copy the bytes into the set.
        char* bytes = static_cast<char*>(
            MemoryContextAlloc(set.context, ref.topic_len + ref.key_len + 1));
        std::memcpy(bytes, ref.topic, ref.topic_len);
        std::memcpy(bytes + ref.topic_len, ref.key, ref.key_len);
        sighting->pair.topic = bytes;
        sighting->pair.key = bytes + ref.topic_len;
        sighting->in_flight_seen = false;
    }
    return sighting;
}

bool in_flight_seen(const KeySighting* sighting) { return sighting->in_flight_seen; }

void mark_in_flight(KeySighting* sighting) { sighting->in_flight_seen = true; }

}  // namespace idem::pg
