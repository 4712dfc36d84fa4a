// Sessions waiting for a key or a lock, in shared memory (library
// preloaded): one entry per backend, kept in lists by hash bucket, so that
// a commit wakes only the sessions waiting for what it changed, and costs
// its session the same however many wait.
//
// A committing session signals at most kFanOut of the sessions that were
// waiting for a value when it committed; each session so woken first hands
// the wake-up on to at most kFanOut more of them, then looks at what it
// waits for. A crowd of N waiters is so woken in about log2(N) hand-overs,
// and the committing session's work is bounded. A session that registers
// after the commit's wake-up is not part of it: it looks after registering,
// and sees the commit.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

inline constexpr int kFanOut = 2;

// Shared memory: called from the module's request and startup hooks.
Size waiter_table_size();
void init_waiter_table();
bool waiter_table_present();

// This session waits for `value` (a hash of what it waits for) from now
// on; a session already waiting for it stays where it is.
void register_waiter(std::uint64_t value);
// Whether a commit signalled this session since it registered (it is then
// no longer registered, and has a wake-up to hand on).
bool waiter_signalled();
// Whether this session is registered (or signalled and not yet handed on).
bool waiter_registered();
// Hands a wake-up this session received on, if it has one.
void hand_on_wakeup();
// Leaves the table (handing on a wake-up first).
void unregister_waiter();

// Signals the sessions waiting for `value` (at most kFanOut: see above);
// returns how many were signalled.
int signal_waiters(std::uint64_t value);

}  // namespace idem::pg
