// The key derived for the external call of one step of a key's work, to
// pass as the provider's own idempotency key (idem_step_key): the same for
// every attempt at the work, different for every (scope, key, step).
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

// "<step>-<32 hex digits>": the step's name, readable in the provider's
// logs, then the first 128 bits of the SHA-256 of the scope, the key and
// the step, each as its UTF-8 bytes (pg/keys/digest_bytes.hpp) preceded by
// their number (so no two triples give one text): the clients compute the
// same without a round trip.
text* step_key(const KeyId& id, const text* step);

}  // namespace idem::pg
