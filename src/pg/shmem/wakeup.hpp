// Wake-ups for callers that wait (idem_claim and idem_lock with `wait`).
// With the library preloaded a waiter sleeps on a shared condition variable
// chosen by hashing what it waits for; the transaction that frees it
// broadcasts that variable when it commits. Without preload the waiter polls.
#pragma once

#include <cstdint>

#include "core/time.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

enum class WaitTopic : std::uint32_t { Key = 1, Lock = 2 };

// The wake-up channel of a key (scope, key) or a lock (resource).
std::uint32_t wake_channel(WaitTopic topic, const text* first, const text* second = nullptr);

// Before checking whether it must wait, a waiter announces itself, so that a
// commit between its check and its sleep still wakes it.
void prepare_to_wait(std::uint32_t channel);
// Sleeps until woken or `until`; `round` paces polling without preload.
void wait_for_wakeup(std::uint32_t channel, Micros until, int round);
void stop_waiting();

// Wakes the channel's waiters when the current transaction commits.
void wake_on_commit(std::uint32_t channel);

void install_wakeup_callbacks();

}  // namespace idem::pg
