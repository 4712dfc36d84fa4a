#include "pg/spi.hpp"

namespace idem::pg {

namespace {

SPIPlanPtr prepared(Statement& statement, int cursor_options) {
    if (statement.plan == nullptr) {
        SPIPlanPtr plan = SPI_prepare_cursor(statement.sql, statement.nargs, statement.argtypes,
                                             cursor_options);
        if (plan == nullptr)
            elog(ERROR, "idempotency: could not prepare statement: %s",
                 SPI_result_code_string(SPI_result));
        SPI_keepplan(plan);
        statement.plan = plan;
    }
    return statement.plan;
}

}  // namespace

std::uint64_t execute(Statement& statement, const Params& params, long limit) {
    const int rc = SPI_execute_plan(prepared(statement, 0), const_cast<Datum*>(params.values),
                                    params.nulls, false, limit);
    if (rc < 0) elog(ERROR, "idempotency: statement failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

std::uint64_t execute_in_subtransaction(Statement& statement, const Params& params,
                                        bool keep_if_rows, long limit) {
    MemoryContext const caller_context = CurrentMemoryContext;
    ResourceOwner const caller_owner = CurrentResourceOwner;
    volatile std::uint64_t processed = 0;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(caller_context);
    PG_TRY();
    {
        processed = execute(statement, params, limit);
        if (keep_if_rows && processed > 0)
            ReleaseCurrentSubTransaction();
        else
            RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
    }
    PG_CATCH();
    {
        // Leave the subtransaction before the error goes on to the caller.
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        ReThrowError(error);
    }
    PG_END_TRY();
    return processed;
}

Portal open_cursor(Statement& statement, const Params& params) {
    constexpr int kOptions = CURSOR_OPT_NO_SCROLL | CURSOR_OPT_FAST_PLAN | CURSOR_OPT_GENERIC_PLAN;
    Portal cursor = SPI_cursor_open(nullptr, prepared(statement, kOptions),
                                    const_cast<Datum*>(params.values), params.nulls, false);
    if (cursor == nullptr)
        elog(ERROR, "idempotency: could not open cursor: %s", SPI_result_code_string(SPI_result));
    return cursor;
}

std::uint64_t fetch(Portal cursor, long count) {
    SPI_cursor_fetch(cursor, true, count);
    return SPI_processed;
}

void close_cursor(Portal cursor) { SPI_cursor_close(cursor); }

Datum column(int column, bool* isnull, std::uint64_t row) {
    return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, isnull);
}

std::optional<std::int64_t> column_int8(int index, std::uint64_t row) {
    bool isnull = false;
    const Datum value = column(index, &isnull, row);
    if (isnull) return std::nullopt;
    return DatumGetInt64(value);
}

std::optional<Micros> column_timestamp(int index, std::uint64_t row) {
    bool isnull = false;
    const Datum value = column(index, &isnull, row);
    if (isnull) return std::nullopt;
    return DatumGetTimestampTz(value);
}

Datum column_copy(int index, bool* present, std::uint64_t row) {
    bool isnull = false;
    const Datum value = column(index, &isnull, row);
    *present = !isnull;
    if (isnull) return 0;
    return SPI_datumTransfer(value, false, -1);
}

void connect_spi() {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
}

void finish_spi() {
    if (SPI_finish() != SPI_OK_FINISH) elog(ERROR, "idempotency: SPI_finish failed");
}

}  // namespace idem::pg
