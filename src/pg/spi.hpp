// Prepared SPI statements, planned once per backend and kept, and the small
// helpers every store uses to bind parameters and read a result row.
// Plans hold only query text and parameter types: when an extension object
// they use is dropped and created again, PostgreSQL re-plans them by name.
#pragma once

#include <cstdint>
#include <optional>

#include "pg/postgres.hpp"

namespace idem::pg {

struct Statement {
    const char* sql;
    int nargs;
    Oid argtypes[10];
    SPIPlanPtr plan;  // prepared on first use, kept for the backend's life
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
};

// Runs the statement (planning it on first use); returns SPI_processed.
std::uint64_t execute(Statement& statement, const Params& params, long limit = 0);

// Runs the statement in a subtransaction that is kept (its changes and row
// locks become the caller's) only when `keep_if_rows` and it returned rows;
// otherwise it is rolled back. A statement that waited for a concurrent
// transaction and then changed nothing (a locking read, an upsert whose
// WHERE failed) so leaves no row lock behind to block that row's holder.
// Result rows are readable only when the subtransaction was kept.
std::uint64_t execute_in_subtransaction(Statement& statement, const Params& params,
                                        bool keep_if_rows, long limit = 0);

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
