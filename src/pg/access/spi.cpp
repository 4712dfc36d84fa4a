#include "pg/access/spi.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/statement_guard.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

// The text of one of the extension's objects for a template's @name@.
void append_object(StringInfo sql, const ExtensionObjects& objects, const char* name,
                   std::size_t length) {
    struct Named {
        const char* name;
        Oid relation;
    };
    const Named tables[] = {{"keys", objects.keys},     {"inbox", objects.inbox},
                            {"locks", objects.locks},   {"outbox", objects.outbox},
                            {"relay_grants", objects.relay_grants},
                            {"tombstones", objects.tombstones}};
    for (const Named& table : tables) {
        if (std::strlen(table.name) != length || std::strncmp(table.name, name, length) != 0)
            continue;
        if (!OidIsValid(table.relation))
            elog(ERROR, "idempotency: the installed version of the extension has no table %s",
                 table.name);
        appendStringInfoString(sql, qualified_table_name(table.relation));
        return;
    }
    if (length == 9 && std::strncmp(name, "token_seq", length) == 0) {
        appendStringInfo(sql, "(%u::pg_catalog.oid)::pg_catalog.regclass", objects.token_seq);
        return;
    }
    elog(ERROR, "idempotency: unknown object @%.*s@ in a statement", static_cast<int>(length), name);
}

bool token_is(const char* token, std::size_t length, const char* word) {
    return std::strlen(word) == length && std::strncmp(token, word, length) == 0;
}

// Whether "@if table.column@" holds: the table exists and has the column.
bool condition_holds(const ExtensionObjects& objects, const char* condition, std::size_t length) {
    const char* dot = static_cast<const char*>(std::memchr(condition, '.', length));
    if (dot == nullptr) elog(ERROR, "idempotency: malformed condition in a statement");
    const std::size_t table_length = static_cast<std::size_t>(dot - condition);
    Oid relation = InvalidOid;
    if (token_is(condition, table_length, "keys")) relation = objects.keys;
    if (token_is(condition, table_length, "outbox")) relation = objects.outbox;
    if (token_is(condition, table_length, "tombstones")) relation = objects.tombstones;
    if (!OidIsValid(relation)) return false;
    char column[NAMEDATALEN];
    strlcpy(column, dot + 1, std::min<std::size_t>(sizeof column, length - table_length));
    return get_attnum(relation, column) != InvalidAttrNumber;
}

// The statement's SQL with the objects filled in, after the marker the
// statement guard knows the module's statements by. "@if table.column@ A
// @else@ B @end@" keeps A when the installed table has that column and B
// otherwise: the library serves databases not yet updated to its version.
// Conditions nest: a branch inside one not taken is left out whatever its
// own condition says.
char* expand(const char* sql, const ExtensionObjects& objects) {
    StringInfoData out;
    initStringInfo(&out);
    appendStringInfoString(&out, kStatementMarker);
    int depth = 0;          // conditions open
    int skipping_from = 0;  // the depth of the branch not taken that we are in; 0: none
    for (const char* at = sql; *at != '\0'; ++at) {
        const char* end = *at == '@' ? std::strchr(at + 1, '@') : nullptr;
        const bool keeping = skipping_from == 0;
        if (end == nullptr) {
            if (keeping) appendStringInfoChar(&out, *at);
            continue;
        }
        const char* token = at + 1;
        const std::size_t length = static_cast<std::size_t>(end - token);
        if (length > 3 && std::strncmp(token, "if ", 3) == 0) {
            ++depth;
            if (keeping && !condition_holds(objects, token + 3, length - 3)) skipping_from = depth;
        } else if (token_is(token, length, "else")) {
            if (skipping_from == depth)
                skipping_from = 0;
            else if (keeping)
                skipping_from = depth;
        } else if (token_is(token, length, "end")) {
            if (skipping_from == depth) skipping_from = 0;
            if (depth > 0) --depth;
        } else if (keeping) {
            append_object(&out, objects, token, length);
        }
        at = end;
    }
    return out.data;
}

Oid argument_type(Oid declared, const ExtensionObjects& objects) {
    if (declared == kStatusType) return objects.status_type;
    if (declared == kOutboxStateType) return objects.outbox_state_type;
    return declared;
}

SPIPlanPtr prepared(Statement& statement, int cursor_options) {
    const ExtensionObjects& objects = extension_objects();
    if (statement.plan != nullptr && statement.generation == objects.generation)
        return statement.plan;
    if (statement.plan != nullptr) {
        SPI_freeplan(statement.plan);
        statement.plan = nullptr;
    }
    Oid types[10];
    for (int i = 0; i < statement.nargs; ++i) types[i] = argument_type(statement.argtypes[i], objects);
    char* sql = expand(statement.sql, objects);
    SPIPlanPtr plan = SPI_prepare_cursor(sql, statement.nargs, types, cursor_options);
    if (plan == nullptr)
        elog(ERROR, "idempotency: could not prepare statement: %s", SPI_result_code_string(SPI_result));
    pfree(sql);
    SPI_keepplan(plan);
    statement.plan = plan;
    statement.generation = objects.generation;
    return plan;
}

// Drops the lines of an error's context that quote one of the module's
// statements: their text is an internal matter, not the caller's.
void hide_statement_text(ErrorData* error) {
    error->internalquery = nullptr;
    error->internalpos = 0;
    if (error->context == nullptr) return;
    StringInfoData kept;
    initStringInfo(&kept);
    for (char* line = error->context; line != nullptr && *line != '\0';) {
        char* next = std::strchr(line, '\n');
        const std::size_t length = next ? static_cast<std::size_t>(next - line) : std::strlen(line);
        if (std::strstr(line, kStatementMarker) == nullptr ||
            (next != nullptr && std::strstr(line, kStatementMarker) > next)) {
            if (kept.len > 0) appendStringInfoChar(&kept, '\n');
            appendBinaryStringInfo(&kept, line, static_cast<int>(length));
        }
        line = next ? next + 1 : nullptr;
    }
    error->context = kept.len > 0 ? kept.data : nullptr;
}

// Runs `run` (SPI work) and re-raises any error it raises without the
// statement's text. Nothing here has a destructor.
template <typename Run>
void without_statement_text(Run run) {
    MemoryContext const caller_context = CurrentMemoryContext;
    PG_TRY();
    { run(); }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        hide_statement_text(error);
        ReThrowError(error);
    }
    PG_END_TRY();
}

}  // namespace

std::uint64_t execute(Statement& statement, const Params& params, long limit) {
    without_statement_text([&] {
        const int rc = SPI_execute_plan(prepared(statement, statement.options),
                                        const_cast<Datum*>(params.values), params.nulls, false,
                                        limit);
        if (rc < 0) elog(ERROR, "idempotency: statement failed: %s", SPI_result_code_string(rc));
    });
    return SPI_processed;
}

std::uint64_t execute_due(Statement& statement, Micros cutoff, int batch) {
    Params params;
    params.add_timestamp(cutoff).add_int4(batch);
    return execute(statement, params);
}

std::uint64_t execute_latest(Statement& statement, const Params& params) {
    without_statement_text([&] {
        const int rc = SPI_execute_snapshot(prepared(statement, statement.options),
                                            const_cast<Datum*>(params.values),
                                            params.nulls, GetLatestSnapshot(), InvalidSnapshot,
                                            false, true, 0);
        if (rc < 0) elog(ERROR, "idempotency: statement failed: %s", SPI_result_code_string(rc));
    });
    return SPI_processed;
}

std::uint64_t execute_with_snapshot(Statement& statement, const Params& params, Snapshot snapshot) {
    without_statement_text([&] {
        const int rc = SPI_execute_snapshot(prepared(statement, statement.options),
                                            const_cast<Datum*>(params.values), params.nulls,
                                            snapshot, InvalidSnapshot, true, false, 0);
        if (rc < 0) elog(ERROR, "idempotency: statement failed: %s", SPI_result_code_string(rc));
    });
    return SPI_processed;
}

namespace {

// lock_timeout for the running subtransaction (its end restores the setting):
// whole milliseconds, at least one, since 0 would mean forever.
void set_local_lock_timeout(Micros timeout) {
    const long long ms = std::min<long long>(INT_MAX, std::max<long long>(1, (timeout + 999) / 1000));
    char setting[32];
    snprintf(setting, sizeof setting, "%lld", ms);
    (void)set_config_option("lock_timeout", setting, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
                            true, 0, false);
}

// Runs `run` in an internal subtransaction, kept when `run` returns true and
// rolled back otherwise. With `timeout` > 0 every lock wait inside is
// bounded by it, and a wait that runs out rolls the subtransaction back and
// returns false; any other error rolls it back and goes on to the caller.
// Nothing here has a destructor.
template <typename Run>
bool in_subtransaction(Micros timeout, Run run) {
    MemoryContext const caller_context = CurrentMemoryContext;
    ResourceOwner const caller_owner = CurrentResourceOwner;
    volatile bool in_time = true;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(caller_context);
    PG_TRY();
    {
        if (timeout > 0) set_local_lock_timeout(timeout);
        if (run())
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
        if (timeout <= 0 || error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE) ReThrowError(error);
        FreeErrorData(error);
        in_time = false;
    }
    PG_END_TRY();
    return in_time;
}

}  // namespace

std::uint64_t execute_in_subtransaction(Statement& statement, const Params& params,
                                        bool keep_if_rows, long limit, Micros lock_timeout,
                                        bool* timed_out) {
    std::uint64_t processed = 0;
    const bool in_time = in_subtransaction(lock_timeout, [&] {
        processed = execute(statement, params, limit);
        return keep_if_rows && processed > 0;
    });
    if (timed_out != nullptr) *timed_out = !in_time;
    return in_time ? processed : 0;
}

bool wait_within(Statement& statement, const Params& params, Micros timeout) {
    return in_subtransaction(std::max<Micros>(timeout, 1), [&] {
        (void)execute(statement, params, 1);
        return false;
    });
}

bool wait_for_transaction(TransactionId xid, Micros timeout) {
    // The subtransaction writes nothing (it takes no transaction id).
    return in_subtransaction(std::max<Micros>(timeout, 1), [&] {
        XactLockTableWait(xid, nullptr, nullptr, XLTW_None);
        return false;
    });
}

bool wait_for_row_waiters(Oid relation, const ItemPointerData& tid, Micros timeout) {
    LOCKTAG tag;
    SET_LOCKTAG_TUPLE(tag, MyDatabaseId, relation, ItemPointerGetBlockNumber(&tid),
                      ItemPointerGetOffsetNumber(&tid));
    // The mode a row lock's wait takes (FOR NO KEY UPDATE, UPDATE); the
    // subtransaction's rollback releases it.
    return in_subtransaction(std::max<Micros>(timeout, 1), [&] {
        (void)LockAcquire(&tag, ExclusiveLock, false, false);
        return false;
    });
}

Portal open_cursor(Statement& statement, const Params& params) {
    constexpr int kOptions = CURSOR_OPT_NO_SCROLL | CURSOR_OPT_FAST_PLAN | CURSOR_OPT_GENERIC_PLAN;
    Portal cursor = nullptr;
    without_statement_text([&] {
        cursor = SPI_cursor_open(nullptr, prepared(statement, kOptions),
                                 const_cast<Datum*>(params.values), params.nulls, false);
        if (cursor == nullptr)
            elog(ERROR, "idempotency: could not open cursor: %s", SPI_result_code_string(SPI_result));
    });
    return cursor;
}

std::uint64_t fetch(Portal cursor, long count) {
    without_statement_text([&] { SPI_cursor_fetch(cursor, true, count); });
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
