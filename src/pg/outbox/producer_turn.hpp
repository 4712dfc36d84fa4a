// The turns of outbox keys. Keys share 1024 turns by hash, so a
// transaction holds at most 1024 such locks however many keys it touches.
//
// With the ready queue (0.5.0), a transaction takes the turns of the keys it
// enqueued for, acked or redrove only in the step before its commit, all in
// one pass in turn order, and holds them only until the commit ends: two
// such passes never wait for each other in a cycle, and no producer waits
// for another's open transaction (pg/outbox/heads.hpp). Before 0.5.0, an
// enqueue of a keyed event takes its key's turn at once and holds it until
// its transaction ends, so that within a key ids follow commit order.
//
// Each turn also has a commit count in shared memory (library preloaded):
// a transaction that took the turn adds to it once its commit is visible,
// before it gives the turn back. A transaction that read the count before
// it looked at a key, and finds it unchanged once it holds the turn, knows
// that nothing committed on that turn since it looked. A prepared
// transaction marks its turns instead (COMMIT PREPARED may run anywhere);
// the next holder of the turn does the full check and clears the mark.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

inline constexpr std::uint32_t kProducerTurns = 1024;

// The turn of (topic, key).
std::uint32_t producer_turn_of(const text* topic, const text* key);

// Waits for the turn (deadlock-detected, cancellable) and holds it until
// the transaction ends.
void take_producer_turn(std::uint32_t turn);
void take_producer_turn(const text* topic, const text* key);

// The turn's commit count; kNoCount without the shared memory.
inline constexpr std::uint64_t kNoCount = ~std::uint64_t{0};
std::uint64_t turn_count(std::uint32_t turn);
// Whether the turn, held now, is unchanged since `seen` (and not marked by
// a prepared transaction, whose mark is cleared).
bool turn_unchanged(std::uint32_t turn, std::uint64_t seen);
// After the commit (still holding the turns), or before a PREPARE.
void turns_committed(const std::uint32_t* turns, int count);
void turns_prepared(const std::uint32_t* turns, int count);

// Its part of the shared memory (listed in module.cpp): size and set-up (under
// AddinShmemInitLock).
Size producer_turn_size();
void init_producer_turns();

}  // namespace idem::pg
