// The digest a tombstone is found by: the first 16 bytes of the SHA-256 of
// the scope's UTF-8 bytes, one zero byte, and the key's UTF-8 bytes, as a
// uuid (pg/keys/digest_bytes.hpp). Text holds no zero byte, so two
// different (scope, key) pairs never hash the same input. The
// purge computes the same in SQL (pg/keys/key_store.cpp); sql/tombstones.sql
// checks that the two agree.
//
// Two different keys with one digest would make the second answered from
// the first's tombstone. For n tombstones the chance that any two of them
// collide is about n^2 / 2^129: below 10^-20 for a billion.
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_id.hpp"

namespace idem::pg {

// A uuid datum, palloc'd.
Datum tombstone_digest(const KeyId& id);

}  // namespace idem::pg
