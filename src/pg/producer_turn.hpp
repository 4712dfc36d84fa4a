// The turns of outbox keys. Keys share 1024 turns by hash, so a
// transaction holds at most 1024 such locks however many keys it touches.
//
// With the ready queue (0.5.0), a transaction takes the turns of the keys it
// enqueued for, acked or redrove only in the step before its commit, all in
// one pass in turn order, and holds them only until the commit ends: two
// such passes never wait for each other in a cycle, and no producer waits
// for another's open transaction (pg/outbox_heads.hpp). Before 0.5.0, an
// enqueue of a keyed event takes its key's turn at once and holds it until
// its transaction ends, so that within a key ids follow commit order.
#pragma once

#include <cstdint>

#include "pg/postgres.hpp"

namespace idem::pg {

inline constexpr std::uint32_t kProducerTurns = 1024;

// The turn of (topic, key).
std::uint32_t producer_turn_of(const text* topic, const text* key);

// Waits for the turn (deadlock-detected, cancellable) and holds it until
// the transaction ends.
void take_producer_turn(std::uint32_t turn);
void take_producer_turn(const text* topic, const text* key);

}  // namespace idem::pg
