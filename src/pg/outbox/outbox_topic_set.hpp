// The distinct topics of a claim's list, and whether a topic is among them.
// Built once per claim, in time linear in the list (hashed, not sorted), so
// that a list of 100,000 topics costs about what reading the array costs.
// Allocated in the current memory context (no destructor), so a PostgreSQL
// error may jump over it.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

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

// The set of a text[]'s elements (NULL elements are left out).
TopicSet make_topic_set(Datum array);

bool topic_set_contains(const TopicSet& set, const text* topic);

}  // namespace idem::pg
