// Prepared SPI statements, planned once per backend and kept, and the small
// helpers every store uses to bind parameters and read a result row.
//
// A statement's SQL is a template: @keys@, @inbox@, @locks@, @outbox@ and
// @relay_grants@ stand for the extension's tables and @token_seq@ for its
// sequence, and the argument types kStatusType and kOutboxStateType for its
// enum types. They are filled in from the objects found by OID
// (pg/access/extension_objects.hpp) when the statement is planned, and planned
// again whenever those objects change (a rename, DROP and CREATE EXTENSION).
// Errors raised by a statement do not show its text.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Stand-ins for the extension's enum types among a statement's argtypes.
inline constexpr Oid kStatusType = 1;
inline constexpr Oid kOutboxStateType = 2;

struct Statement {
    const char* sql;
    int nargs;
    Oid argtypes[10];
    SPIPlanPtr plan = nullptr;      // prepared on first use, kept while the objects stay
    std::uint64_t generation = 0;   // of the objects it was planned for
    // CURSOR_OPT_* planner options: CURSOR_OPT_GENERIC_PLAN for a statement
    // whose custom plans would cost more to make than to run.
    int options = 0;
};

// Parameters of one execution. Trivially destructible.
struct Params {
    Datum values[10];
    char nulls[10];
    int count = 0;

    Params& add(Datum value) {
        values[count] = value;
        nulls[count++] = ' ';
        return *this;
    }
    Params& add_null() {
        values[count] = 0;
        nulls[count++] = 'n';
        return *this;
    }
    Params& add_text(const text* value) {
        return value ? add(PointerGetDatum(value)) : add_null();
    }
    Params& add_datum(Datum value, bool present) { return present ? add(value) : add_null(); }
    Params& add_timestamp(std::optional<Micros> value) {
        return value ? add(TimestampTzGetDatum(*value)) : add_null();
    }
    Params& add_int8(std::int64_t value) { return add(Int64GetDatum(value)); }
    Params& add_int4(std::int32_t value) { return add(Int32GetDatum(value)); }
    Params& add_interval(Micros value) {
        Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
        interval->time = value;
        return add(IntervalPGetDatum(interval));
    }
};
static_assert(std::is_trivially_destructible_v<Params>);

// Runs the statement (planning it on first use); returns SPI_processed.
std::uint64_t execute(Statement& statement, const Params& params, long limit = 0);

// A sweep's batch: the statement over the rows due by `cutoff` ($1), at most
// `batch` of them ($2); returns SPI_processed.
std::uint64_t execute_due(Statement& statement, Micros cutoff, int batch);

// Runs the statement reading the newest committed data (a snapshot taken
// now, whatever the isolation level), as checks of what other transactions
// did must; returns SPI_processed.
std::uint64_t execute_latest(Statement& statement, const Params& params);

// Runs the statement reading with `snapshot` (it changes nothing); returns
// SPI_processed.
std::uint64_t execute_with_snapshot(Statement& statement, const Params& params, Snapshot snapshot);

// Runs the statement in a subtransaction that is kept (its changes and row
// locks become the caller's) only when `keep_if_rows` and it returned rows;
// otherwise it is rolled back. A statement that waited for a concurrent
// transaction and then changed nothing (a locking read, an upsert whose
// WHERE failed) so leaves no row lock behind to block that row's holder.
// Result rows are readable only when the subtransaction was kept.
// With a `lock_timeout` (> 0) the statement waits at most that long for a
// lock; when the time runs out it is rolled back and *timed_out set.
std::uint64_t execute_in_subtransaction(Statement& statement, const Params& params,
                                        bool keep_if_rows, long limit = 0,
                                        Micros lock_timeout = 0, bool* timed_out = nullptr);

// Runs the statement in a subtransaction that is always rolled back, waiting
// at most `timeout` for a lock (0: not at all); returns false when that time
// ran out. For statements that only wait for other transactions' locks.
bool wait_within(Statement& statement, const Params& params, Micros timeout);

// Waits at most `timeout` for transaction `xid` to end, as a lock wait (so
// that it shows in pg_locks and ends the moment the transaction does);
// false when the time ran out first.
bool wait_for_transaction(TransactionId xid, Micros timeout);

// Waits at most `timeout` for the transactions queued to lock row version
// `tid` of `relation` (a waiter holds the version's tuple lock while it
// waits, as PostgreSQL's row locks do) to have taken it, as a lock wait that
// keeps nothing; false when the time ran out first.
bool wait_for_row_waiters(Oid relation, const ItemPointerData& tid, Micros timeout);

// A cursor over a SELECT's rows, planned once per backend (a generic plan
// tuned for fetching the first rows). Every fetch reads with the snapshot
// taken when the cursor opened, however many statements run in between.
Portal open_cursor(Statement& statement, const Params& params);
// The next `count` rows into SPI_tuptable; returns how many came (fewer
// than `count` once the rows are exhausted).
std::uint64_t fetch(Portal cursor, long count);
void close_cursor(Portal cursor);

// Column `column` (1-based) of result row `row`.
Datum column(int column, bool* isnull, std::uint64_t row = 0);
std::optional<std::int64_t> column_int8(int column, std::uint64_t row = 0);
std::optional<Micros> column_timestamp(int column, std::uint64_t row = 0);
// A by-reference column copied into the caller's memory context, so it
// survives SPI_finish; *present tells whether it was not NULL.
Datum column_copy(int column, bool* present, std::uint64_t row = 0);

void connect_spi();
void finish_spi();

}  // namespace idem::pg
