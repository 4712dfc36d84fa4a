#include "pg/outbox/topic_set.hpp"

#include <cstring>

#include "core/validate.hpp"
#include "pg/boundary/text_bytes.hpp"

extern "C" {
#include "common/hashfn.h"
#include "utils/array.h"
#include "utils/memutils.h"
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

// Throws for a NULL element or a topic that is not a valid name.
void check_topics(ArrayType* array) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int n = 0;
    deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &n);
    for (int i = 0; i < n; ++i) {
        if (nulls[i]) throw_null_argument("an element of topics");
        check_name("topic", VARSIZE_ANY_EXHDR(DatumGetPointer(elements[i])));
    }
    pfree(elements);
    pfree(nulls);
}

// The set of the elements of an array (NULLs left out), pointing into it.
TopicSet build_topic_set(ArrayType* array) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int n = 0;
    deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &n);
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

// The last list a claim was given, and its set.
KeptTopics claim_list{};

bool same_array(const ArrayType* a, const ArrayType* b) {
    return VARSIZE(a) == VARSIZE(b) && std::memcmp(a, b, VARSIZE(a)) == 0;
}

}  // namespace

const TopicSet& topic_set_of(Datum datum) {
    ArrayType* array = DatumGetArrayTypeP(datum);
    if (claim_list.memory != nullptr && same_array(claim_list.array, array)) return claim_list.set;
    check_topics(array);
    keep_topics(&claim_list, PointerGetDatum(array));
    return claim_list.set;
}

void keep_topics(KeptTopics* kept, Datum datum) {
    ArrayType* array = DatumGetArrayTypeP(datum);
    MemoryContext const memory =
        AllocSetContextCreate(CurrentMemoryContext, "idempotency topics", ALLOCSET_DEFAULT_SIZES);
    MemoryContext const caller = MemoryContextSwitchTo(memory);
    auto* copy = static_cast<ArrayType*>(palloc(VARSIZE(array)));
    std::memcpy(copy, array, VARSIZE(array));
    const TopicSet set = build_topic_set(copy);
    MemoryContextSwitchTo(caller);
    MemoryContextSetParent(memory, TopMemoryContext);
    if (kept->memory != nullptr) MemoryContextDelete(kept->memory);
    *kept = KeptTopics{memory, copy, set};
}

bool topic_set_contains(const TopicSet& set, const text* topic) {
    return set.slots[slot_of(set, topic, hash_of(topic))].place != 0;
}

}  // namespace idem::pg
