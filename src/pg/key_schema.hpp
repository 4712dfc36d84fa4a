// Which layout of idempotency.idempotency_keys this database has. The
// library serves databases not yet updated to its version: before 0.3.0 the
// table has no purge_at column, and its sweep indexes follow status and
// expires_at (so that no change at complete could be a HOT update).
#pragma once

namespace idem::pg {

// Whether the table has purge_at (0.3.0 and later). Cached per backend;
// any change to the table's definition (ALTER EXTENSION ... UPDATE) resets
// the cache. Needs a transaction.
bool keys_have_purge_at();

// Whether `table` of schema idempotency exists and, when `column` is not
// null, has that column. Needs a transaction.
bool extension_has(const char* table, const char* column);

}  // namespace idem::pg
