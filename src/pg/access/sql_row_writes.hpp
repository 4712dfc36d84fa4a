// The row writes and locks of row_access.cpp (and the insert of a new key)
// as the SQL statements they stand for, run through SPI with exactly the
// values the C++ code computed. Used only when idempotency.direct_table_access
// is off, which exists for the differential test (test/differential/): it
// runs the same calls both ways and compares what they leave behind.
//
// Each call is its own statement (its statement triggers fire for it); the
// direct path makes a table's writes of one kind in one call one statement
// (row_access.hpp). The rows a statement returns are copied back into the
// caller's slot, with their ctid in tts_tid, so that callers that read back
// what was stored (a BEFORE trigger's changes, an id, a head) see it.
//
// The statements find rows by ctid: under READ COMMITTED a row changed
// concurrently is followed to its newest version, as a TID scan's recheck
// does, where the direct path decides again on it (Change::Again); this path
// is for a test whose calls are made by one session, and keeps it simple:
// the SQL is built per call, clarity before speed.
//
// Everything here may raise a PostgreSQL error; it holds only trivially
// destructible locals, and the SPI connection is released by the abort.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg::sql_rows {

// Whether the writes go through SQL (idempotency.direct_table_access off).
bool wanted();

// INSERT INTO t (the columns of `row` that are not NULL) VALUES (...)
// [ON CONFLICT (the columns of index `arbiter`) DO NOTHING] RETURNING: true
// with the row stored copied into `row`; false when nothing was inserted
// (a BEFORE trigger skipped it, or the arbiter found a conflict).
bool insert(Relation table, TupleTableSlot* row, Oid arbiter = InvalidOid);

// UPDATE t SET <the `changed` columns> = their values in `row` WHERE ctid =
// `tid` RETURNING: true with the row stored copied into `row`; false when no
// row was changed (a BEFORE trigger skipped it).
bool update(Relation table, const ItemPointerData* tid, TupleTableSlot* row,
            const AttrNumber* changed, int changed_count);

// DELETE FROM t WHERE ctid = `tid`: false when no row was deleted.
bool remove(Relation table, const ItemPointerData* tid);

// SELECT ... FROM t WHERE ctid = `tid` FOR NO KEY UPDATE [SKIP LOCKED]:
// true with the row locked (its newest version) copied into `into`.
bool lock(Relation table, const ItemPointerData* tid, bool skip_locked, TupleTableSlot* into);

// A statement of `command` that writes no row (UPDATE t SET c = c WHERE
// false, ...): its statement triggers fire, as those of a statement that
// finds nothing to change do.
void empty_statement(Relation table, CmdType command);

}  // namespace idem::pg::sql_rows
