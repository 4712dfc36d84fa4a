// The indexes of a table written directly (access/row_access.hpp), opened as
// the executor's ExecOpenIndices opens them, but with the IndexInfo of each
// btree index (its columns, expressions and partial-index predicate, ready
// to evaluate) built once per backend and kept until the index changes,
// instead of once per statement: most of what an insert into a table with
// several partial and expression indexes costs besides the index entries.
//
// An IndexInfo in use by a write is never freed under it (an invalidation
// only retires it); the unique indexes' also carry what a speculative
// insertion needs. Other index methods get a fresh IndexInfo each time.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Opens `target`'s indexes with RowExclusiveLock into its index arrays.
void open_indexes(ResultRelInfo* target);
// Closes them (as ExecCloseIndices does) and gives their IndexInfo back.
void close_indexes(ResultRelInfo* target);

}  // namespace idem::pg
