// The columns of idempotency.idempotency_keys and what each read and write
// of a key puts in them: the one place that names them. Each column is
// found by name in the installed table (0 when the installed version has
// not got it: the library serves databases not yet updated), once per
// table layout. A new column is added here: to KeyColumns, and to the
// writes that set it.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "pg/boundary/postgres.hpp"
#include "pg/keys/key_insert.hpp"
#include "pg/keys/key_store.hpp"

namespace idem::pg {

struct KeyColumns {
    AttrNumber scope, key, status, token, attempts, lease_until, next_attempt_at, fingerprint,
        result, last_error, job_ref, created_at, updated_at, completed_at, expires_at, claimed_at,
        registered, lease_expired, holder_pid, purge_at, max_attempts, retention, active_since,
        key_retention,  // 0.7.0
        steps;
};

// The columns of the keys table `keys` (open).
const KeyColumns& key_columns(Relation keys);

// The stored key in `row` (a row of the keys table), its by-reference
// values copied into the current memory context.
void read_stored_key(TupleTableSlot* row, const KeyColumns& at, Oid status_type, StoredKey* out);

// A write of a key's row: the row to write (new, or a copy of the key's
// row), and the columns set so far, as an INSERT's column list or an
// UPDATE's SET list names them. Trivially destructible.
struct KeyWrite {
    TupleTableSlot* row;
    const KeyColumns* at;
    Oid status_type;  // idem_status of the installed extension
    AttrNumber set[32];
    int count;
};
static_assert(std::is_trivially_destructible_v<KeyWrite>);

// The row of a new key (a claim's, under `token`, or a register's).
void write_new_key(KeyWrite* write, const NewKey& key, std::int64_t token);
// The transitions (key_store.hpp says what each means).
void write_grant(KeyWrite* write, const StoredKey& stored, const Grant& grant, Micros now,
                 std::int64_t token, std::int32_t attempts);
// `key_retention`: how long the key's tombstone is kept (retain_key), or
// the server's setting at the purge when not given.
void write_completion(KeyWrite* write, const StoredKey& stored, Datum result, bool has_result,
                      Micros now, Micros expires_at, std::optional<Micros> key_retention);
void write_expiry(KeyWrite* write, Status next, Micros now, std::optional<Micros> expires_at);
void write_failure(KeyWrite* write, Status next, const text* error, Micros now,
                   std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at,
                   std::optional<Micros> key_retention);
void write_renewal(KeyWrite* write, Micros lease_until);
void write_release(KeyWrite* write, const StoredKey& stored, Status next, Micros now);
void write_steps(KeyWrite* write, Datum steps);

// An interval value of `micros` microseconds.
Datum interval_datum(Micros micros);

}  // namespace idem::pg
