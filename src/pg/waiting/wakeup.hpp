// Wake-ups for callers that wait (idem_claim and idem_lock with `wait`).
// With the library preloaded a waiter registers what it waits for in the
// shared waiter table (waiting/waiter_table.hpp) and sleeps on its latch; the
// transaction that frees it signals, when it commits, the first of the
// sessions waiting for that key or lock, and those hand the wake-up on:
// a waiter wakes only for its own key or lock, and a crowd of them costs
// the committing session a bounded amount of work. Without preload the
// waiter polls.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/time.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

enum class WaitTopic : std::uint32_t { Key = 1, Lock = 2 };

// The wake-up channel of what is waited for, named by the texts that
// identify it (a key's identity, a lock's resource): their hash, never 0.
std::uint64_t wake_channel(WaitTopic topic, std::initializer_list<const text*> names);

// Before checking whether it must wait, a waiter announces itself, so that a
// commit between its check and its sleep still wakes it.
void prepare_to_wait(std::uint64_t channel);
// Sleeps until woken or `until`; `round` paces polling without preload.
// A wake-up received is handed on before it returns.
void wait_for_wakeup(Micros until, int round);
void stop_waiting();
// Hands on a wake-up this session received, before it blocks on something
// else (another transaction): the sessions behind it need not wait for that.
void hand_on_received_wakeup();

// Wakes the channel's waiters when the current transaction commits.
void wake_on_commit(std::uint64_t channel);

void install_wakeup_callbacks();

}  // namespace idem::pg
