#include "pg/outbox/outbox_topic_set.hpp"

#include "pg/boundary/text_bytes.hpp"

extern "C" {
#include "common/hashfn.h"
#include "utils/array.h"
}

namespace idem::pg {

namespace {

std::uint32_t hash_of(const text* topic) {
    return hash_bytes(reinterpret_cast<const unsigned char*>(VARDATA_ANY(topic)),
                      static_cast<int>(VARSIZE_ANY_EXHDR(topic)));
}

// The slot holding `topic`, or the empty slot where it would go.
std::uint32_t slot_of(const TopicSet& set, const text* topic, std::uint32_t hash) {
    std::uint32_t slot = hash & set.mask;
    while (set.slots[slot].place != 0 &&
           (set.slots[slot].hash != hash ||
            !same_text_bytes(set.topics[set.slots[slot].place - 1], topic)))
        slot = (slot + 1) & set.mask;
    return slot;
}

}  // namespace

TopicSet make_topic_set(Datum array) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int n = 0;
    deconstruct_array(DatumGetArrayTypeP(array), TEXTOID, -1, false, TYPALIGN_INT, &elements,
                      &nulls, &n);
    // At most half full: short probes.
    std::uint32_t capacity = 16;
    while (capacity < 2 * static_cast<std::uint32_t>(n)) capacity *= 2;
    TopicSet set{};
    set.topics = static_cast<const text**>(palloc(sizeof(text*) * (n + 1)));
    set.slots = static_cast<TopicSlot*>(palloc0(sizeof(TopicSlot) * capacity));
    set.mask = capacity - 1;
    for (int i = 0; i < n; ++i) {
        if (nulls[i]) continue;
        const text* topic = DatumGetTextPP(elements[i]);
        const std::uint32_t hash = hash_of(topic);
        const std::uint32_t slot = slot_of(set, topic, hash);
        if (set.slots[slot].place != 0) continue;
        set.topics[set.count++] = topic;
        set.slots[slot] = TopicSlot{hash, static_cast<std::uint32_t>(set.count)};
    }
    return set;
}

bool topic_set_contains(const TopicSet& set, const text* topic) {
    return set.slots[slot_of(set, topic, hash_of(topic))].place != 0;
}

}  // namespace idem::pg
