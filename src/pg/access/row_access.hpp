// One row of one of the extension's tables, found through an index and
// read, locked, inserted, changed or deleted directly (the table access
// method, its indexes and the executor's trigger and constraint routines),
// the way PostgreSQL's logical replication apply worker changes rows, with
// the semantics of the SQL statements it replaces:
// - each step takes its snapshot as a statement of a function does (the
//   command counter advanced first, so it sees what the call wrote before;
//   a fresh snapshot under READ COMMITTED, the transaction's under
//   REPEATABLE READ and SERIALIZABLE, whose predicate locks the index and
//   heap access take);
// - a locking find is SELECT ... FOR NO KEY UPDATE [SKIP LOCKED]: under READ
//   COMMITTED it waits for a concurrent change and locks the row's newest
//   version when that still has the same index key; under the stricter
//   levels a row changed since the snapshot raises 40001;
// - an update of a row found without a lock is UPDATE ... WHERE: it waits
//   for a concurrent change of the row and, under READ COMMITTED, hands the
//   newest version back locked for the caller to decide again on (as the
//   executor's recheck of the WHERE clause does);
// - a write fires the table's row and statement triggers (transition
//   tables included; a table's writes of one kind are one statement),
//   checks its constraints, keeps every index (an update that changes no
//   indexed column stays a HOT update) and is WAL-logged by the access
//   method.
// Rules on the tables are not followed (the extension defines none).
//
// Everything here may raise a PostgreSQL error: callers hold only
// trivially destructible objects, and what is open is released by the
// abort. Memory comes from the caller's context.
#pragma once

#include <type_traits>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// The statement of one kind of write a table's writes make.
struct WriteStatement {
    bool started;
    TransitionCaptureState* capture;  // its transition tables, when triggers want them
};

// A table opened for one operation: its writes of each kind (insert,
// update, delete) are one statement for the triggers. Trivially
// destructible: an error may leave it open, and the abort releases it.
struct OpenTable {
    Relation heap;
    Relation index;         // the index rows are found by
    LOCKMODE lock;          // AccessShareLock to read, RowExclusiveLock to write
    EState* estate;         // writes: the executor state of the change
    ResultRelInfo* target;  // writes: the table with its indexes and triggers
    TupleTableSlot* found;  // the row a find returned
    bool found_locked;      // this call holds a lock on it
    ScanKeyData keys[4];    // the index key it was found by
    int key_count;
    bool step_open;  // a step's snapshot is active
    bool wrote;      // a write was made (made visible at close)
    bool after_triggers_queued;
    WriteStatement statements[3];  // insert, update, delete
    // idempotency.direct_table_access off (the differential test): the
    // writes and locks run as SQL statements (sql_row_writes.hpp); a
    // statement started that wrote no row runs empty at the close, so that
    // its statement triggers fire as the direct path's do.
    bool via_sql;
    bool sql_written[3];
};
static_assert(std::is_trivially_destructible_v<OpenTable>);

// Opens `table` and `index` (the table's primary key when `index` is
// InvalidOid) to read, or to write with its indexes.
OpenTable open_to_read(Oid table, Oid index = InvalidOid);
// ... to lock rows without changing them (as SELECT ... FOR UPDATE does).
OpenTable open_to_lock(Oid table, Oid index = InvalidOid);
OpenTable open_to_write(Oid table, Oid index = InvalidOid);
// Fires what the writes queued (AFTER triggers) and closes everything;
// the locks stay until the transaction ends, as a statement's do. The
// command counter is advanced after a write, as SPI does after a
// statement, so that what follows in the transaction sees it.
void close_table(OpenTable* table);

enum class RowLock {
    None,             // a plain read
    ForUpdate,        // FOR NO KEY UPDATE
    ForUpdateIfFree,  // FOR NO KEY UPDATE SKIP LOCKED: nothing when another holds it
    // ForUpdateIfFree, and nothing either when another transaction waits to
    // lock it: the rows' waiters go first, in their order, also when the
    // row's holder has just ended (a transaction that comes at that moment
    // would otherwise take the row before them); a row this transaction
    // holds already is locked as it is. The direct path only; the SQL path
    // is SKIP LOCKED.
    ForUpdateIfNoneWaits,
};

// Finds the row whose index columns equal `values` (one per index key
// column, compared with the index's equality operators; at most 4) in a
// new step, into table->found. False when there is none (or, locking, when
// it went away, or is held and `lock` is ForUpdateIfFree or
// ForUpdateIfNoneWaits).
// With `new_step` false, a later find of the same statement: it reads with
// the step's snapshot (as one UPDATE of many rows does) instead of a new one.
bool find_row(OpenTable* table, const Datum* values, RowLock lock, bool new_step = true);
// Under a transaction snapshot (REPEATABLE READ, SERIALIZABLE): whether a
// transaction that committed after the snapshot inserted, changed or
// deleted the row whose index columns equal `values`, that is whether the
// version the snapshot sees (or its seeing none) is no longer the newest
// committed one. Reads in a new step, locks nothing, leaves table->found
// empty.
bool row_changed_since_snapshot(OpenTable* table, const Datum* values);
// Whether another transaction still in progress has inserted, changed or
// deleted the row whose index columns equal `values` (a dirty read: a
// writer whose statement would make a write of the row wait). Locks
// nothing, waits for nothing, leaves table->found empty.
bool row_being_written(OpenTable* table, const Datum* values);
// Finds the row version `tid` as a TID scan does (when the step's snapshot
// sees it), into table->found, and locks it as find_row does; there is no
// index key to check a newer version against: the caller checks the row.
// `tid` must be a version this transaction read from the table since it
// opened it (the table's lock keeps VACUUM from truncating it away).
bool find_row_version(OpenTable* table, const ItemPointerData* tid, RowLock lock,
                      bool new_step = true);
// The transaction that locked or changed the row version in `row` (its
// xmax), when a plain one: invalid when none did, or a MultiXact holds it.
TransactionId row_holder(TupleTableSlot* row);

// Locks the row found without a lock (FOR NO KEY UPDATE, waiting): false
// when it went away; table->found then holds its newest version.
bool lock_found_row(OpenTable* table);

// A row to write: the table's descriptor, all NULL or a copy of the found
// row, set column by column.
TupleTableSlot* new_row(OpenTable* table);
TupleTableSlot* changed_row(OpenTable* table);
inline void set_column(TupleTableSlot* row, AttrNumber column, Datum value) {
    if (column == 0) return;  // a column the installed version has not
    row->tts_values[column - 1] = value;
    row->tts_isnull[column - 1] = false;
}
inline void set_null(TupleTableSlot* row, AttrNumber column) {
    if (column == 0) return;
    row->tts_values[column - 1] = 0;
    row->tts_isnull[column - 1] = true;
}

// The statement a table's writes of one kind make (insert, update or
// delete) starts with the first of them: its BEFORE STATEMENT triggers fire
// then, and its transition tables (returned, when triggers want them)
// collect the rows until the table is closed, when its AFTER STATEMENT
// triggers fire. The writes below start it themselves.
TransitionCaptureState* start_statement(OpenTable* table, CmdType command);
// A statement that may write no row (UPDATE ... WHERE id = ANY (ids)):
// started in a new step, whose snapshot the finds that follow without a
// new step read with, so that its statement triggers fire whatever it
// finds, as the statement's do.
void begin_statement(OpenTable* table, CmdType command);

// What INSERT does to a new row before its BEFORE triggers: the columns
// left NULL get their defaults (so a column with a default cannot be
// inserted NULL here). Then, after them: stored generated columns and the
// table's constraints, for `command`'s row (insert_row and update_found_row
// do both themselves).
void fill_defaults_of(OpenTable* table, TupleTableSlot* row);
void check_row(OpenTable* table, TupleTableSlot* row, CmdType command);

// Inserts `row` (from new_row; columns left NULL get their defaults), as
// INSERT does.
void insert_row(OpenTable* table, TupleTableSlot* row);
enum class Change {
    Done,     // written
    Skipped,  // a BEFORE trigger skipped it
    Again,    // the row changed concurrently: table->found holds its newest
              // version, locked; decide again on it
    Gone,     // the row was deleted concurrently (or changed by this command)
};
// Replaces the row found by `row` (from changed_row), as UPDATE does;
// `changed` are the columns it sets, as an UPDATE's SET list names them
// (triggers on columns look at them; 0: a column not installed).
Change update_found_row(OpenTable* table, TupleTableSlot* row, const AttrNumber* changed,
                        int changed_count);
// Deletes the row found and locked, as DELETE does; false when a BEFORE
// trigger skipped it.
bool delete_found_row(OpenTable* table);

// Writes made at the commit (from a pre-commit callback), after the commit
// fired the transaction's deferred triggers: the deferred triggers they
// queued fire now, since there is no later point (the commit would drop
// them unfired).
void fire_triggers_deferred_to_commit();

// The found row as a composite datum of the table's row type, copied, with
// every column of the table (a column added since the row was stored holds
// its default, as a table read shows it).
Datum found_row_datum(OpenTable* table);

}  // namespace idem::pg
