// Producers of one outbox (topic, key) take turns. An enqueue of a keyed
// event holds, until its transaction ends, a lock on the key's turn, taken
// before the event gets its id: within a key, ids then follow commit order,
// and a relay never sees event n+1 committed while event n is still to come.
#pragma once

#include "pg/postgres.hpp"

namespace idem::pg {

// Waits for the key's turn (deadlock-detected, cancellable). Keys share
// 1024 turns by hash, so a transaction holds at most 1024 such locks
// however many keys it enqueues.
void take_producer_turn(const text* topic, const text* key);

}  // namespace idem::pg
