#include "pg/access/row_access.hpp"

#include "pg/access/index_infos.hpp"
#include "pg/access/sql_row_writes.hpp"

extern "C" {
#include "access/relscan.h"
#include "access/table.h"
#include "access/xact.h"
#include "executor/nodeModifyTable.h"
#include "rewrite/rewriteHandler.h"
#include "tcop/utility.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

void end_step(OpenTable* table) {
    if (!table->step_open) return;
    PopActiveSnapshot();
    table->step_open = false;
    if (table->estate != nullptr) table->estate->es_snapshot = InvalidSnapshot;
}

// A step starts as each statement of a function does under SPI: the
// command counter advanced (so the step sees the call's earlier writes),
// then the statement's snapshot made active until the next step or the
// table's close (triggers run under it).
void begin_step(OpenTable* table) {
    end_step(table);
    CommandCounterIncrement();
    PushActiveSnapshot(GetTransactionSnapshot());
    UpdateActiveSnapshotCommandId();
    table->step_open = true;
    if (table->estate != nullptr) {
        table->estate->es_snapshot = GetActiveSnapshot();
        // The step's writes are made in its command, as a statement's are.
        table->estate->es_output_cid = GetCurrentCommandId(true);
    }
}

Relation index_to_find_by(OpenTable* table, Oid index) {
    if (!OidIsValid(index)) index = primary_key_index(table->heap);
    if (!OidIsValid(index))
        elog(ERROR, "idempotency: table \"%s\" has no primary key",
             RelationGetRelationName(table->heap));
    // A writer has the table's indexes open already.
    if (table->target != nullptr)
        for (int i = 0; i < table->target->ri_NumIndices; ++i)
            if (RelationGetRelid(table->target->ri_IndexRelationDescs[i]) == index)
                return table->target->ri_IndexRelationDescs[i];
    return index_open(index, table->lock);
}

bool index_owned(const OpenTable* table) {
    if (table->target == nullptr) return true;
    for (int i = 0; i < table->target->ri_NumIndices; ++i)
        if (table->target->ri_IndexRelationDescs[i] == table->index) return false;
    return true;
}

// The equality function of an index column's operator family, remembered
// (an operator family's members are fixed while an index uses them).
Oid equality_procedure(Oid family, Oid type) {
    struct Known {
        Oid family, type, procedure;
    };
    constexpr int kKept = 8;
    static Known known[kKept];
    static int used = 0;
    static int next = 0;  // the entry replaced when all are used
    for (int i = 0; i < used; ++i)
        if (known[i].family == family && known[i].type == type) return known[i].procedure;
    const Oid procedure =
        get_opcode(get_opfamily_member(family, type, type, BTEqualStrategyNumber));
    if (!OidIsValid(procedure)) return procedure;
    const int slot = used < kKept ? used++ : next++ % kKept;
    known[slot] = Known{family, type, procedure};
    return procedure;
}

// The scan keys of an equality lookup of `values` in `index`.
int equality_keys(Relation index, const Datum* values, ScanKeyData* keys) {
    const int count = IndexRelationGetNumberOfKeyAttributes(index);
    if (count > 4)
        elog(ERROR, "idempotency: index \"%s\" has too many columns to find rows by",
             RelationGetRelationName(index));
    for (int i = 0; i < count; ++i) {
        // A found row is checked again against the key by its columns.
        if (index->rd_index->indkey.values[i] == 0)
            elog(ERROR, "idempotency: index \"%s\" has an expression: rows are found by columns",
                 RelationGetRelationName(index));
        const Oid procedure = equality_procedure(index->rd_opfamily[i], index->rd_opcintype[i]);
        if (!OidIsValid(procedure))
            elog(ERROR, "idempotency: index \"%s\" has no equality operator",
                 RelationGetRelationName(index));
        ScanKeyInit(&keys[i], static_cast<AttrNumber>(i + 1), BTEqualStrategyNumber, procedure,
                    values[i]);
        keys[i].sk_collation = index->rd_indcollation[i];
    }
    return count;
}

// Whether the row in `slot` still has the index key `keys` (a newer
// version found by following an update may have another).
bool still_matches(Relation index, TupleTableSlot* slot, ScanKeyData* keys, int count) {
    for (int i = 0; i < count; ++i) {
        const AttrNumber column = index->rd_index->indkey.values[i];
        bool isnull = false;
        const Datum value = slot_getattr(slot, column, &isnull);
        if (isnull || !DatumGetBool(FunctionCall2Coll(&keys[i].sk_func, keys[i].sk_collation, value,
                                                      keys[i].sk_argument)))
            return false;
    }
    return true;
}

// What the executor checks before a statement that writes or locks rows
// starts (ExecCheckXactReadOnly): a read-only transaction, and so a hot
// standby, refuses it with 25006 before any trigger fires or any
// transaction id is taken.
void refuse_if_read_only(CmdType command) {
    if (!XactReadOnly) return;
    PreventCommandIfReadOnly(command == CMD_INSERT   ? "INSERT"
                             : command == CMD_UPDATE ? "UPDATE"
                             : command == CMD_DELETE ? "DELETE"
                                                     : "SELECT FOR NO KEY UPDATE");
}

[[noreturn]] void raise_serialization_failure() {
    ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                    errmsg("could not serialize access due to concurrent update")));
    pg_unreachable();
}

// Locks the row in table->found as SELECT ... FOR NO KEY UPDATE does
// (ExecLockRows): under READ COMMITTED its newest version, rechecked
// against the index key; false when the row is gone, held (skip), or no
// longer has the key.
bool lock_found(OpenTable* table, RowLock lock) {
    const bool skip = lock != RowLock::ForUpdate;
    if (table->via_sql) {
        ItemPointerData seen = table->found->tts_tid;
        table->found_locked = sql_rows::lock(table->heap, &seen, skip, table->found);
        return table->found_locked;
    }
    refuse_if_read_only(CMD_SELECT);
    const bool follow = !IsolationUsesXactSnapshot();
    TM_FailureData failure;
    ItemPointerData tid = table->found->tts_tid;
    // A transaction waiting to lock a row holds the row's tuple lock while
    // it waits (the mode of an UPDATE's wait): taken here, it says whether
    // one waits.
    // A row this transaction holds already has no waiter to give way to.
    ItemPointerData queued = tid;
    const bool check_queue = lock == RowLock::ForUpdateIfNoneWaits &&
                             !TransactionIdIsCurrentTransactionId(row_holder(table->found));
    if (check_queue && !try_lock_tuple(table->heap, &queued, ExclusiveLock)) return false;
    const TM_Result result = table_tuple_lock(
        table->heap, &tid, GetActiveSnapshot(), table->found, GetCurrentCommandId(true),
        LockTupleNoKeyExclusive, skip ? LockWaitSkip : LockWaitBlock,
        follow ? TUPLE_LOCK_FLAG_FIND_LAST_VERSION : 0, &failure);
    if (check_queue) UnlockTuple(table->heap, &queued, ExclusiveLock);
    switch (result) {
        case TM_Ok:
            table->found_locked =
                !failure.traversed ||
                still_matches(table->index, table->found, table->keys, table->key_count);
            return table->found_locked;
        case TM_WouldBlock:    // held by another transaction (SKIP LOCKED)
        case TM_SelfModified:  // changed by this very command: as deleted
            return false;
        case TM_Updated:
            if (IsolationUsesXactSnapshot()) raise_serialization_failure();
            elog(ERROR, "idempotency: unexpected result %d locking a row",
                 static_cast<int>(result));
            return false;
        case TM_Deleted:
            if (IsolationUsesXactSnapshot()) raise_serialization_failure();
            return false;
        default:
            elog(ERROR, "idempotency: unexpected result %d locking a row",
                 static_cast<int>(result));
            return false;
    }
}

bool has_any_trigger(const ResultRelInfo* target) { return target->ri_TrigDesc != nullptr; }

int statement_index(CmdType command) {
    return command == CMD_INSERT ? 0 : command == CMD_UPDATE ? 1 : 2;
}

}  // namespace

TransitionCaptureState* start_statement(OpenTable* table, CmdType command) {
    WriteStatement& statement = table->statements[statement_index(command)];
    if (statement.started) return statement.capture;
    statement.started = true;
    if (table->via_sql) return nullptr;  // each SQL statement fires its own (and refuses itself)
    refuse_if_read_only(command);
    TriggerDesc* triggers = table->target->ri_TrigDesc;
    if (triggers == nullptr) return nullptr;
    statement.capture =
        MakeTransitionCaptureState(triggers, RelationGetRelid(table->heap), command);
    if (command == CMD_INSERT && triggers->trig_insert_before_statement)
        ExecBSInsertTriggers(table->estate, table->target);
    if (command == CMD_UPDATE && triggers->trig_update_before_statement)
        ExecBSUpdateTriggers(table->estate, table->target);
    if (command == CMD_DELETE && triggers->trig_delete_before_statement)
        ExecBSDeleteTriggers(table->estate, table->target);
    return statement.capture;
}

void begin_statement(OpenTable* table, CmdType command) {
    begin_step(table);
    (void)start_statement(table, command);
}

namespace {

// The statements started that wrote no row, run empty (through SQL).
void run_empty_statements(OpenTable* table) {
    const CmdType commands[3] = {CMD_INSERT, CMD_UPDATE, CMD_DELETE};
    for (int i = 0; i < 3; ++i)
        if (table->statements[i].started && !table->sql_written[i])
            sql_rows::empty_statement(table->heap, commands[i]);
}

void end_statements(OpenTable* table) {
    if (table->via_sql) return;
    TriggerDesc* triggers = table->target->ri_TrigDesc;
    if (triggers == nullptr) return;
    const WriteStatement* statements = table->statements;
    if (statements[0].started && triggers->trig_insert_after_statement)
        ExecASInsertTriggers(table->estate, table->target, statements[0].capture);
    if (statements[1].started && triggers->trig_update_after_statement)
        ExecASUpdateTriggers(table->estate, table->target, statements[1].capture);
    if (statements[2].started && triggers->trig_delete_after_statement)
        ExecASDeleteTriggers(table->estate, table->target, statements[2].capture);
}

}  // namespace

void fill_defaults_of(OpenTable* table, TupleTableSlot* row) {
    const TupleDesc desc = RelationGetDescr(table->heap);
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        if (!row->tts_isnull[i] || attribute->attisdropped || attribute->attgenerated ||
            (!attribute->atthasdef && !attribute->attidentity))
            continue;
        Node* expression = build_column_default(table->heap, i + 1);
        if (expression == nullptr) continue;
        ExprState* state = ExecPrepareExpr(reinterpret_cast<Expr*>(expression), table->estate);
        row->tts_values[i] = ExecEvalExprSwitchContext(state, GetPerTupleExprContext(table->estate),
                                                       &row->tts_isnull[i]);
    }
}

void check_row(OpenTable* table, TupleTableSlot* row, CmdType command) {
    Relation heap = table->heap;
    if (heap->rd_att->constr != nullptr && heap->rd_att->constr->has_generated_stored)
        ExecComputeStoredGenerated(table->target, table->estate, row, command);
    if (heap->rd_att->constr != nullptr) ExecConstraints(table->target, row, table->estate);
}

namespace {

OpenTable open_without_writes(Oid table_oid, Oid index, LOCKMODE lock) {
    OpenTable table{};
    table.lock = lock;
    table.heap = table_open(table_oid, table.lock);
    table.index = index_to_find_by(&table, index);
    table.found = table_slot_create(table.heap, nullptr);
    table.via_sql = sql_rows::wanted();
    return table;
}

}  // namespace

OpenTable open_to_read(Oid table_oid, Oid index) {
    return open_without_writes(table_oid, index, AccessShareLock);
}

OpenTable open_to_lock(Oid table_oid, Oid index) {
    return open_without_writes(table_oid, index, RowShareLock);
}

OpenTable open_to_write(Oid table_oid, Oid index) {
    OpenTable table{};
    table.lock = RowExclusiveLock;
    table.heap = table_open(table_oid, table.lock);
    table.estate = CreateExecutorState();
    init_single_range_table(table.estate, table.heap, table.lock);
    table.target = makeNode(ResultRelInfo);
    InitResultRelInfo(table.target, table.heap, 1, nullptr, 0);
    table.estate->es_output_cid = GetCurrentCommandId(true);
    open_indexes(table.target);
    table.index = index_to_find_by(&table, index);
    table.found = table_slot_create(table.heap, &table.estate->es_tupleTable);
    table.via_sql = sql_rows::wanted();
    if (has_any_trigger(table.target)) {
        AfterTriggerBeginQuery();
        table.after_triggers_queued = true;
    }
    return table;
}

void close_table(OpenTable* table) {
    if (table->via_sql && table->estate != nullptr) run_empty_statements(table);
    if (table->after_triggers_queued) {
        end_statements(table);
        AfterTriggerEndQuery(table->estate);
        // The tables the AFTER triggers' events were fired for.
        ExecCloseResultRelations(table->estate);
    }
    end_step(table);
    if (index_owned(table)) index_close(table->index, NoLock);
    if (table->estate != nullptr) {
        close_indexes(table->target);
        ExecResetTupleTable(table->estate->es_tupleTable, false);
        FreeExecutorState(table->estate);
    } else {
        ExecDropSingleTupleTableSlot(table->found);
    }
    // The lock is kept to the transaction's end, as a statement's.
    table_close(table->heap, NoLock);
    const bool wrote = table->wrote;
    *table = OpenTable{};
    if (wrote) CommandCounterIncrement();
}

namespace {

// Fetches into table->found the row keyed by table->keys that `snapshot`
// sees, through the unique index (one version at most).
bool fetch_by_key(OpenTable* table, Snapshot snapshot) {
    IndexScanDesc scan = begin_index_scan(table->heap, table->index, snapshot, table->key_count);
    index_rescan(scan, table->keys, table->key_count, nullptr, 0);
    const bool found = index_getnext_slot(scan, ForwardScanDirection, table->found);
    index_endscan(scan);
    return found;
}

// The version of the row keyed by table->keys that `snapshot` sees.
bool visible_version(OpenTable* table, Snapshot snapshot, ItemPointerData* tid) {
    const bool found = fetch_by_key(table, snapshot);
    if (found) *tid = table->found->tts_tid;
    ExecClearTuple(table->found);
    return found;
}

}  // namespace

bool find_row(OpenTable* table, const Datum* values, RowLock lock, bool new_step) {
    if (new_step || !table->step_open) begin_step(table);
    table->found_locked = false;
    table->key_count = equality_keys(table->index, values, table->keys);
    bool found = fetch_by_key(table, GetActiveSnapshot());
    if (found && lock != RowLock::None) found = lock_found(table, lock);
    if (!found) ExecClearTuple(table->found);
    return found;
}

bool row_changed_since_snapshot(OpenTable* table, const Datum* values) {
    begin_step(table);
    table->found_locked = false;
    table->key_count = equality_keys(table->index, values, table->keys);
    ItemPointerData seen;
    ItemPointerData newest;
    const bool in_snapshot = visible_version(table, GetActiveSnapshot(), &seen);
    Snapshot latest = RegisterSnapshot(GetLatestSnapshot());
    const bool in_latest = visible_version(table, latest, &newest);
    UnregisterSnapshot(latest);
    return in_snapshot != in_latest || (in_snapshot && !ItemPointerEquals(&seen, &newest));
}

bool row_being_written(OpenTable* table, const Datum* values) {
    table->found_locked = false;
    table->key_count = equality_keys(table->index, values, table->keys);
    SnapshotData dirty;
    InitDirtySnapshot(dirty);
    const bool found = fetch_by_key(table, &dirty);
    ExecClearTuple(table->found);
    // A dirty read sets xmin (an insert) or xmax (a change or delete) when
    // the writer is still in progress; this transaction's writes set neither.
    return found && (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax));
}

bool find_row_version(OpenTable* table, const ItemPointerData* tid, RowLock lock, bool new_step) {
    if (new_step || !table->step_open) begin_step(table);
    table->found_locked = false;
    table->key_count = 0;  // no index key: the caller checks the row again
    ItemPointerData version = *tid;
    bool found =
        table_tuple_fetch_row_version(table->heap, &version, GetActiveSnapshot(), table->found);
    if (found && lock != RowLock::None) found = lock_found(table, lock);
    if (!found) ExecClearTuple(table->found);
    return found;
}

TupleTableSlot* new_row(OpenTable* table) {
    TupleTableSlot* row =
        ExecInitExtraTupleSlot(table->estate, RelationGetDescr(table->heap), &TTSOpsVirtual);
    const int natts = row->tts_tupleDescriptor->natts;
    for (int i = 0; i < natts; ++i) {
        row->tts_values[i] = 0;
        row->tts_isnull[i] = true;
    }
    ExecStoreVirtualTuple(row);
    return row;
}

TupleTableSlot* changed_row(OpenTable* table) {
    TupleTableSlot* row =
        ExecInitExtraTupleSlot(table->estate, RelationGetDescr(table->heap), &TTSOpsVirtual);
    ExecCopySlot(row, table->found);
    return row;
}

void insert_row(OpenTable* table, TupleTableSlot* row) {
    begin_step(table);
    if (table->via_sql) {
        table->statements[0].started = table->sql_written[0] = true;
        if (!sql_rows::insert(table->heap, row))
            elog(ERROR, "idempotency: a trigger on table \"%s\" refused a new row",
                 RelationGetRelationName(table->heap));
        table->wrote = true;
        return;
    }
    refuse_if_read_only(CMD_INSERT);
    ResultRelInfo* target = table->target;
    TriggerDesc* triggers = target->ri_TrigDesc;
    fill_defaults_of(table, row);
    TransitionCaptureState* capture = start_statement(table, CMD_INSERT);
    bool wanted = true;
    if (triggers != nullptr && triggers->trig_insert_before_row)
        wanted = ExecBRInsertTriggers(table->estate, target, row);
    if (wanted) {
        check_row(table, row, CMD_INSERT);
        simple_table_tuple_insert(table->heap, row);
        table->wrote = true;
        List* recheck = nullptr;
        if (target->ri_NumIndices > 0)
            recheck = insert_new_row_index_entries(target, row, table->estate);
        ExecARInsertTriggers(table->estate, target, row, recheck, capture);
        list_free(recheck);
    }
    if (!wanted)
        elog(ERROR, "idempotency: a trigger on table \"%s\" refused a new row",
             RelationGetRelationName(table->heap));
}

TransactionId row_holder(TupleTableSlot* row) {
    bool copied = false;
    HeapTuple tuple = ExecFetchSlotHeapTuple(row, false, &copied);
    const HeapTupleHeader header = tuple->t_data;
    TransactionId xmax = InvalidTransactionId;
    if (!(header->t_infomask & HEAP_XMAX_INVALID) && !(header->t_infomask & HEAP_XMAX_IS_MULTI))
        xmax = HeapTupleHeaderGetRawXmax(header);
    if (copied) heap_freetuple(tuple);
    return xmax;
}

bool lock_found_row(OpenTable* table) {
    if (table->found_locked) return true;
    const bool locked = lock_found(table, RowLock::ForUpdate);
    if (!locked) ExecClearTuple(table->found);
    return locked;
}

namespace {

// The table access method's update of the found row, waiting for a
// concurrent change of it; what ExecUpdate does when that happens.
Change write_update(OpenTable* table, ItemPointer tid, TupleTableSlot* row, List** recheck) {
    TM_FailureData failure;
    LockTupleMode mode;
    NewIndexEntries entries = NewIndexEntries::None;
    const CommandId command = table->estate->es_output_cid;
    const TM_Result result = update_row_waiting(
        table->heap, tid, row, command, table->estate->es_snapshot, &failure, &mode, &entries);
    switch (result) {
        case TM_Ok:
            *recheck = insert_updated_row_index_entries(table->target, row, table->estate, entries);
            return Change::Done;
        case TM_SelfModified:
            if (failure.cmax != command)
                ereport(ERROR, (errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
                                errmsg("tuple to be updated was already modified by an operation "
                                       "triggered by the current command")));
            return Change::Gone;
        case TM_Updated:
        case TM_Deleted:
            if (IsolationUsesXactSnapshot()) raise_serialization_failure();
            if (result == TM_Deleted) return Change::Gone;
            // The newest version, locked, for the caller to decide again on.
            return lock_found(table, RowLock::ForUpdate) ? Change::Again : Change::Gone;
        default:
            elog(ERROR, "idempotency: unexpected result %d updating a row",
                 static_cast<int>(result));
            return Change::Gone;
    }
}

}  // namespace

Change update_found_row(OpenTable* table, TupleTableSlot* row, const AttrNumber* changed,
                        int changed_count) {
    if (table->via_sql) {
        table->statements[1].started = table->sql_written[1] = true;
        ItemPointerData tid = table->found->tts_tid;
        if (!sql_rows::update(table->heap, &tid, row, changed, changed_count))
            return Change::Skipped;
        table->wrote = true;
        return Change::Done;
    }
    refuse_if_read_only(CMD_UPDATE);
    ResultRelInfo* target = table->target;
    TriggerDesc* triggers = target->ri_TrigDesc;
    // BEFORE ROW triggers lock the row themselves, and could not follow a
    // concurrent update from here: it is locked first.
    const bool before_row = triggers != nullptr && triggers->trig_update_before_row;
    if (before_row && !table->found_locked) {
        ItemPointerData seen = table->found->tts_tid;
        if (!lock_found(table, RowLock::ForUpdate)) return Change::Gone;
        if (!ItemPointerEquals(&seen, &table->found->tts_tid)) return Change::Again;
    }
    Bitmapset* columns = nullptr;
    for (int i = 0; i < changed_count; ++i)
        if (changed[i] != 0)
            columns = bms_add_member(columns, changed[i] - FirstLowInvalidHeapAttributeNumber);
    set_updated_columns(table->estate, columns);
    ItemPointerData tid = table->found->tts_tid;
    CheckCmdReplicaIdentity(table->heap, CMD_UPDATE);
    TransitionCaptureState* capture = start_statement(table, CMD_UPDATE);
    Change change = Change::Done;
    if (before_row) {
        EPQState recheck_state;
        init_trigger_recheck(&recheck_state, table->estate);
        if (!before_row_update(table->estate, &recheck_state, target, &tid, row))
            change = Change::Skipped;
        EvalPlanQualEnd(&recheck_state);
    }
    if (change == Change::Done) {
        check_row(table, row, CMD_UPDATE);
        List* recheck = nullptr;
        change = write_update(table, &tid, row, &recheck);
        table->wrote = table->wrote || change == Change::Done;
        if (change == Change::Done)
            ExecARUpdateTriggers(table->estate, target, nullptr, nullptr, &tid, nullptr, row,
                                 recheck, capture, false);
        list_free(recheck);
    }
    return change;
}

bool delete_found_row(OpenTable* table) {
    if (table->via_sql) {
        table->statements[2].started = table->sql_written[2] = true;
        ItemPointerData tid = table->found->tts_tid;
        const bool deleted = sql_rows::remove(table->heap, &tid);
        table->wrote = table->wrote || deleted;
        return deleted;
    }
    refuse_if_read_only(CMD_DELETE);
    ResultRelInfo* target = table->target;
    TriggerDesc* triggers = target->ri_TrigDesc;
    ItemPointerData tid = table->found->tts_tid;
    CheckCmdReplicaIdentity(table->heap, CMD_DELETE);
    TransitionCaptureState* capture = start_statement(table, CMD_DELETE);
    bool wanted = true;
    if (triggers != nullptr && triggers->trig_delete_before_row) {
        EPQState recheck_state;
        init_trigger_recheck(&recheck_state, table->estate);
        wanted = before_row_delete(table->estate, &recheck_state, target, &tid);
        EvalPlanQualEnd(&recheck_state);
    }
    if (wanted) {
        simple_table_tuple_delete(table->heap, &tid, table->estate->es_snapshot);
        table->wrote = true;
        ExecARDeleteTriggers(table->estate, target, &tid, nullptr, capture, false);
    }
    return wanted;
}

void fire_triggers_deferred_to_commit() { AfterTriggerFireDeferred(); }

Datum found_row_datum(OpenTable* table) {
    TupleTableSlot* found = table->found;
    const TupleDesc desc = found->tts_tupleDescriptor;
    bool copied = false;
    HeapTuple tuple = ExecFetchSlotHeapTuple(found, false, &copied);
    // A row stored before ALTER TABLE ... ADD COLUMN lacks the new column: a
    // table read fills in its default, but a composite datum is read by
    // descriptors that do not (a function scan's), so the datum is made to
    // carry every column.
    Datum row;
    if (HeapTupleHeaderGetNatts(tuple->t_data) < desc->natts) {
        slot_getallattrs(found);
        row = HeapTupleGetDatum(heap_form_tuple(desc, found->tts_values, found->tts_isnull));
    } else {
        row = heap_copy_tuple_as_datum(tuple, desc);
    }
    if (copied) heap_freetuple(tuple);
    return row;
}

}  // namespace idem::pg
