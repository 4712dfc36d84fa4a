// The identity of an idempotency key: its scope and its key, the primary
// key of idempotency_keys. It travels whole from the arguments that name a
// key to the insert, the reads and changes of its row, the transition log
// and the wake-ups of its waiters, so that a column added to the identity
// changes the keys' files and no other.
#pragma once

#include <cstdint>
#include <type_traits>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Trivially destructible: it lives across calls that may raise an error.
struct KeyId {
    text* scope;
    text* key;
};
static_assert(std::is_trivially_destructible_v<KeyId>);

// The primary key's values of a key, in its column order.
inline constexpr int kKeyIdColumns = 2;
struct KeyIdValues {
    Datum values[kKeyIdColumns];
};
KeyIdValues key_id_values(const KeyId& id);

// The key a function's arguments name: the key at `key_at`, its scope at
// `scope_at` (checked as arguments are, the key first).
KeyId key_id_arg(FunctionCallInfo fcinfo, int key_at, int scope_at);

// Raises 40001 for a key that a transaction committed after this one's
// snapshot changed (`how`, such as "another transaction changed it"): there
// is no answer the snapshot could give about it.
[[noreturn]] void throw_changed_since_snapshot(const KeyId& id, const char* how);

// The wake-up channel of the sessions waiting for the key
// (waiting/wakeup.hpp).
std::uint64_t key_wake_channel(const KeyId& id);

}  // namespace idem::pg
