#include "pg/access/sql_row_writes.hpp"

#include "pg/boundary/settings.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "utils/rel.h"
}

namespace idem::pg::sql_rows {

namespace {

// A statement being built: its text and parameters (palloc'd; trivially
// destructible).
struct Sql {
    StringInfoData text;
    Oid* types;
    Datum* values;
    char* nulls;
    int count;
};

Sql start_sql(Relation table) {
    Sql sql{};
    initStringInfo(&sql.text);
    const int most = RelationGetDescr(table)->natts + 2;
    sql.types = static_cast<Oid*>(palloc(sizeof(Oid) * most));
    sql.values = static_cast<Datum*>(palloc(sizeof(Datum) * most));
    sql.nulls = static_cast<char*>(palloc(most));
    return sql;
}

// Adds a parameter; returns its number ($n).
int add_param(Sql* sql, Oid type, Datum value, bool isnull) {
    sql->types[sql->count] = type;
    sql->values[sql->count] = isnull ? 0 : value;
    sql->nulls[sql->count] = isnull ? 'n' : ' ';
    return ++sql->count;
}

int add_tid(Sql* sql, const ItemPointerData* tid) {
    ItemPointer copy = static_cast<ItemPointer>(palloc(sizeof(ItemPointerData)));
    ItemPointerCopy(tid, copy);
    return add_param(sql, TIDOID, PointerGetDatum(copy), false);
}

const char* table_name(Relation table) {
    return quote_qualified_identifier(get_namespace_name(RelationGetNamespace(table)),
                                      RelationGetRelationName(table));
}

const char* column_name(Relation table, int i) {
    return quote_identifier(NameStr(TupleDescAttr(RelationGetDescr(table), i)->attname));
}

// RETURNING / the select list: ctid, then every column of the table.
void append_row_list(Sql* sql, Relation table) {
    const TupleDesc desc = RelationGetDescr(table);
    appendStringInfoString(&sql->text, "ctid");
    for (int i = 0; i < desc->natts; ++i)
        if (!TupleDescAttr(desc, i)->attisdropped)
            appendStringInfo(&sql->text, ", %s", column_name(table, i));
}

// Runs the statement; returns the rows it processed.
uint64 run(const Sql& sql) {
    const int result = SPI_execute_with_args(sql.text.data, sql.count, sql.types, sql.values,
                                             sql.nulls, false, 0);
    if (result < 0)
        elog(ERROR, "idempotency: SPI_execute_with_args failed (%d) for: %s", result,
             sql.text.data);
    return SPI_processed;
}

// Stores the first row returned (the list of append_row_list) into `into`,
// in `context`, with its ctid as the slot's tid.
void copy_back(Relation table, TupleTableSlot* into, MemoryContext context) {
    const TupleDesc desc = RelationGetDescr(table);
    HeapTuple returned = SPI_tuptable->vals[0];
    const TupleDesc returned_desc = SPI_tuptable->tupdesc;
    bool isnull = false;
    const ItemPointerData tid =
        *reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(returned, returned_desc, 1, &isnull)));
    MemoryContext const old = MemoryContextSwitchTo(context);
    Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * (desc->natts + 1)));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * (desc->natts + 1)));
    int column = 2;
    for (int i = 0; i < desc->natts; ++i) {
        values[i] = 0;
        nulls[i] = true;
        if (TupleDescAttr(desc, i)->attisdropped) continue;
        values[i] = SPI_getbinval(returned, returned_desc, column++, &nulls[i]);
    }
    HeapTuple tuple = heap_form_tuple(desc, values, nulls);
    tuple->t_self = tid;
    tuple->t_tableOid = RelationGetRelid(table);
    ExecForceStoreHeapTuple(tuple, into, true);
    into->tts_tid = tid;
    into->tts_tableOid = RelationGetRelid(table);
    MemoryContextSwitchTo(old);
}

// A column a statement that writes nothing may name (SET c = c).
int plain_column(Relation table) {
    const TupleDesc desc = RelationGetDescr(table);
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        if (!attribute->attisdropped && !attribute->attgenerated && !attribute->attidentity)
            return i;
    }
    elog(ERROR, "idempotency: table \"%s\" has no plain column", RelationGetRelationName(table));
    return -1;
}

}  // namespace

bool wanted() { return !settings::direct_table_access; }

bool insert(Relation table, TupleTableSlot* row, Oid arbiter) {
    MemoryContext const caller = CurrentMemoryContext;
    slot_getallattrs(row);
    const TupleDesc desc = RelationGetDescr(table);
    Sql sql = start_sql(table);
    StringInfoData values;
    initStringInfo(&values);
    bool overriding = false;
    appendStringInfo(&sql.text, "INSERT INTO %s (", table_name(table));
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        // Columns left NULL are left out, so that their defaults apply.
        if (attribute->attisdropped || attribute->attgenerated || row->tts_isnull[i]) continue;
        overriding = overriding || attribute->attidentity == ATTRIBUTE_IDENTITY_ALWAYS;
        const int n = add_param(&sql, attribute->atttypid, row->tts_values[i], false);
        appendStringInfo(&sql.text, "%s%s", n == 1 ? "" : ", ", column_name(table, i));
        appendStringInfo(&values, "%s$%d", n == 1 ? "" : ", ", n);
    }
    if (sql.count == 0) {  // every column left to its default
        resetStringInfo(&sql.text);
        appendStringInfo(&sql.text, "INSERT INTO %s DEFAULT VALUES", table_name(table));
    } else {
        appendStringInfo(&sql.text, ")%s VALUES (%s)",
                         overriding ? " OVERRIDING SYSTEM VALUE" : "", values.data);
    }
    if (OidIsValid(arbiter)) {
        Relation index = index_open(arbiter, AccessShareLock);
        appendStringInfoString(&sql.text, " ON CONFLICT (");
        for (int i = 0; i < IndexRelationGetNumberOfKeyAttributes(index); ++i)
            appendStringInfo(&sql.text, "%s%s", i == 0 ? "" : ", ",
                             column_name(table, index->rd_index->indkey.values[i] - 1));
        appendStringInfoString(&sql.text, ") DO NOTHING");
        index_close(index, AccessShareLock);
    }
    appendStringInfoString(&sql.text, " RETURNING ");
    append_row_list(&sql, table);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
    const bool inserted = run(sql) > 0;
    if (inserted) copy_back(table, row, caller);
    SPI_finish();
    return inserted;
}

bool update(Relation table, const ItemPointerData* tid, TupleTableSlot* row,
            const AttrNumber* changed, int changed_count) {
    MemoryContext const caller = CurrentMemoryContext;
    slot_getallattrs(row);
    const TupleDesc desc = RelationGetDescr(table);
    Sql sql = start_sql(table);
    appendStringInfo(&sql.text, "UPDATE %s SET ", table_name(table));
    bool* named = static_cast<bool*>(palloc0(sizeof(bool) * (desc->natts + 1)));
    int set = 0;
    for (int c = 0; c < changed_count; ++c) {
        const int i = changed[c] - 1;
        if (changed[c] == 0 || named[i]) continue;  // not installed, or named already
        named[i] = true;
        const int n =
            add_param(&sql, TupleDescAttr(desc, i)->atttypid, row->tts_values[i], row->tts_isnull[i]);
        appendStringInfo(&sql.text, "%s%s = $%d", set++ == 0 ? "" : ", ", column_name(table, i),
                         n);
    }
    if (set == 0) {  // an UPDATE names at least one column
        const int i = plain_column(table);
        appendStringInfo(&sql.text, "%s = %s", column_name(table, i), column_name(table, i));
    }
    appendStringInfo(&sql.text, " WHERE ctid = $%d RETURNING ", add_tid(&sql, tid));
    append_row_list(&sql, table);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
    const bool updated = run(sql) > 0;
    if (updated) copy_back(table, row, caller);
    SPI_finish();
    return updated;
}

bool remove(Relation table, const ItemPointerData* tid) {
    Sql sql = start_sql(table);
    appendStringInfo(&sql.text, "DELETE FROM %s WHERE ctid = $%d", table_name(table),
                     add_tid(&sql, tid));
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
    const bool deleted = run(sql) > 0;
    SPI_finish();
    return deleted;
}

bool lock(Relation table, const ItemPointerData* tid, bool skip_locked, TupleTableSlot* into) {
    MemoryContext const caller = CurrentMemoryContext;
    Sql sql = start_sql(table);
    appendStringInfoString(&sql.text, "SELECT ");
    append_row_list(&sql, table);
    appendStringInfo(&sql.text, " FROM %s WHERE ctid = $%d FOR NO KEY UPDATE%s", table_name(table),
                     add_tid(&sql, tid), skip_locked ? " SKIP LOCKED" : "");
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
    const bool locked = run(sql) > 0;
    if (locked) copy_back(table, into, caller);
    SPI_finish();
    return locked;
}

void empty_statement(Relation table, CmdType command) {
    Sql sql = start_sql(table);
    const char* name = table_name(table);
    if (command == CMD_DELETE) {
        appendStringInfo(&sql.text, "DELETE FROM %s WHERE false", name);
    } else {
        const char* column = column_name(table, plain_column(table));
        if (command == CMD_INSERT)
            appendStringInfo(&sql.text, "INSERT INTO %s (%s) SELECT %s FROM %s WHERE false", name,
                             column, column, name);
        else
            appendStringInfo(&sql.text, "UPDATE %s SET %s = %s WHERE false", name, column, column);
    }
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "idempotency: SPI_connect failed");
    (void)run(sql);
    SPI_finish();
}

}  // namespace idem::pg::sql_rows
