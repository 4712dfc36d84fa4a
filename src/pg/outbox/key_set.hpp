// The (topic, key) pairs one claim has met while it walks the live outbox
// in id order. The first live event of a pair is the pair's head; every
// later one waits behind it. Allocated in a memory context (no destructor),
// so a PostgreSQL error may jump over it.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "utils/hsearch.h"
}

namespace idem::pg {

struct OutboxKeySet {
    HTAB* pairs;
    MemoryContext context;  // where met pairs' bytes are copied
};

struct KeySighting;  // one met pair, owned by the set

// An empty set living in `context` (freed with it).
OutboxKeySet make_key_set(MemoryContext context);

// The pair's entry; *first is true when the pair had not been met before
// (the entry is then new, with in_flight_seen false).
KeySighting* meet_key(OutboxKeySet set, const text* topic, const text* key, bool* first);

// Whether an in-flight event of the pair was met; marks that one was.
bool in_flight_seen(const KeySighting* sighting);
void mark_in_flight(KeySighting* sighting);

}  // namespace idem::pg
