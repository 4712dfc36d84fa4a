// The distinct topics of a claim's list, and whether a topic is among them.
// Built in time linear in the list (hashed, not sorted). A relay names the
// same list in every claim, so the backend keeps the set of the last list
// it was given: a claim whose list is byte for byte the last one's costs a
// comparison of the arrays, not a new set (about 100 ns a topic). A relay
// role's granted topics are kept the same way (pg/outbox/relay_scope.hpp).
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "utils/array.h"
}

namespace idem::pg {

// One slot of the open-addressing table: a topic's hash and its place in
// `topics` plus one (0: empty), side by side so that a probe reads one
// cache line.
struct TopicSlot {
    std::uint32_t hash;
    std::uint32_t place;
};

struct TopicSet {
    const text** topics;  // distinct, in the list's order
    int count;
    TopicSlot* slots;
    std::uint32_t mask;   // the number of slots less one (a power of two)
};

// The set of a text[]'s elements: the kept set when the array is the last
// one's, else a new set, kept in its place; valid until the next call. A new
// list is checked as it is read: a NULL element or a topic that is not a
// valid name (empty, over 255 bytes) throws, as any argument would.
const TopicSet& topic_set_of(Datum array);

bool topic_set_contains(const TopicSet& set, const text* topic);

// The topics a call is limited to: every topic unless `limited`; `set`:
// the set of `topics` when the caller already has it, else nullptr.
struct TopicLimit {
    Datum topics;  // text[], when limited
    bool limited;
    const TopicSet* set;
};

// A list of topics and its set that a backend keeps between calls, in a
// memory context of its own under TopMemoryContext (memory nullptr: none).
struct KeptTopics {
    MemoryContext memory;
    const ArrayType* array;
    TopicSet set;
};

// Replaces `kept` with a copy of the text[] `array` and its set (NULL
// elements left out). Built under the caller's context and swapped in
// whole: an error while building leaves `kept` as it was and frees the
// half-built one.
void keep_topics(KeptTopics* kept, Datum array);

}  // namespace idem::pg
