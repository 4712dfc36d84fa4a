// The only way the module includes PostgreSQL: every server header inside
// extern "C", and the version differences in one place.
#pragma once

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/relcache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

#include "core/time.hpp"

// The magic block. From PostgreSQL 18 on it also names the module and its
// version (IDEM_VERSION, the control file's default_version, comes from the
// build), shown by pg_get_loaded_modules().
#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined by the build (the control file's default_version)"
#endif
#if PG_VERSION_NUM >= 180000
#define IDEM_MODULE_MAGIC PG_MODULE_MAGIC_EXT(.name = "idempotency", .version = IDEM_VERSION)
#else
#define IDEM_MODULE_MAGIC PG_MODULE_MAGIC
#endif

namespace idem::pg {

// Node walkers: before PostgreSQL 16 the walker parameter is declared
// without a prototype, which C++ reads as taking no arguments.
using NodeWalker = bool (*)(Node*, void*);
#if PG_VERSION_NUM < 160000
// void (*)() is the function type any other may pass through without a warning.
inline bool (*unprototyped(NodeWalker walker))() {
    return reinterpret_cast<bool (*)()>(reinterpret_cast<void (*)()>(walker));
}
inline bool walk_query(Query* query, NodeWalker walker, void* context, int flags) {
    return query_tree_walker(query, unprototyped(walker), context, flags);
}
inline bool walk_expression(Node* node, NodeWalker walker, void* context) {
    return expression_tree_walker(node, unprototyped(walker), context);
}
#else
inline bool walk_query(Query* query, NodeWalker walker, void* context, int flags) {
    return query_tree_walker(query, walker, context, flags);
}
inline bool walk_expression(Node* node, NodeWalker walker, void* context) {
    return expression_tree_walker(node, walker, context);
}
#endif

// An interval as microseconds (a month counts 30 days, as PostgreSQL compares
// intervals). False for a value beyond int64 or, from PostgreSQL 17 on, an
// infinite interval.
inline bool interval_to_micros(const Interval* value, Micros* out) {
#if PG_VERSION_NUM >= 170000
    if (INTERVAL_NOT_FINITE(value)) return false;
#endif
    const __int128 days = static_cast<__int128>(value->month) * DAYS_PER_MONTH + value->day;
    const __int128 total = days * USECS_PER_DAY + value->time;
    if (total > INT64_MAX || total < INT64_MIN) return false;
    *out = static_cast<Micros>(total);
    return true;
}

}  // namespace idem::pg

namespace idem::pg {

// The executor state of a statement that changes one relation: its range
// table of that one relation, as the direct table access needs it.
inline void init_single_range_table(EState* estate, Relation relation, LOCKMODE lock) {
    RangeTblEntry* entry = makeNode(RangeTblEntry);
    entry->rtekind = RTE_RELATION;
    entry->relid = RelationGetRelid(relation);
    entry->relkind = relation->rd_rel->relkind;
    entry->rellockmode = lock;
#if PG_VERSION_NUM >= 160000
    RTEPermissionInfo* permissions = makeNode(RTEPermissionInfo);
    permissions->relid = RelationGetRelid(relation);
    permissions->inh = false;
    entry->perminfoindex = 1;
#if PG_VERSION_NUM >= 180000
    ExecInitRangeTable(estate, list_make1(entry), list_make1(permissions), bms_make_singleton(1));
#else
    ExecInitRangeTable(estate, list_make1(entry), list_make1(permissions));
#endif
#else
    ExecInitRangeTable(estate, list_make1(entry));
#endif
}

// The columns the next change of that relation sets, as an UPDATE's SET
// list names them (offset by FirstLowInvalidHeapAttributeNumber, as the
// executor keeps them): triggers on columns look at them.
inline void set_updated_columns(EState* estate, Bitmapset* columns) {
#if PG_VERSION_NUM >= 160000
    static_cast<RTEPermissionInfo*>(linitial(estate->es_rteperminfos))->updatedCols = columns;
#else
    exec_rt_fetch(1, estate)->updatedCols = columns;
#endif
}

// The EvalPlanQual state that BEFORE ROW UPDATE and DELETE triggers are
// given (they lock the row, which the caller already holds).
inline void init_trigger_recheck(EPQState* epq, EState* estate) {
#if PG_VERSION_NUM >= 160000
    EvalPlanQualInit(epq, estate, nullptr, NIL, -1, NIL);
#else
    EvalPlanQualInit(epq, estate, nullptr, NIL, -1);
#endif
}

// BEFORE ROW UPDATE and DELETE triggers of a row the caller has locked;
// false when one of them skips the change.
inline bool before_row_update(EState* estate, EPQState* epq, ResultRelInfo* target,
                              ItemPointer tid, TupleTableSlot* row) {
#if PG_VERSION_NUM >= 180000
    return ExecBRUpdateTriggers(estate, epq, target, tid, nullptr, row, nullptr, nullptr, false);
#elif PG_VERSION_NUM >= 160000
    return ExecBRUpdateTriggers(estate, epq, target, tid, nullptr, row, nullptr, nullptr);
#else
    return ExecBRUpdateTriggers(estate, epq, target, tid, nullptr, row, nullptr);
#endif
}
inline bool before_row_delete(EState* estate, EPQState* epq, ResultRelInfo* target,
                              ItemPointer tid) {
#if PG_VERSION_NUM >= 180000
    return ExecBRDeleteTriggers(estate, epq, target, tid, nullptr, nullptr, nullptr, nullptr,
                                false);
#elif PG_VERSION_NUM >= 160000
    return ExecBRDeleteTriggers(estate, epq, target, tid, nullptr, nullptr, nullptr, nullptr);
#else
    return ExecBRDeleteTriggers(estate, epq, target, tid, nullptr, nullptr);
#endif
}

// What index entries a new version of an updated row needs: none for a
// HOT update (from PostgreSQL 16 on, only the summarizing indexes' for one
// that changed only their columns).
enum class NewIndexEntries { None, All, SummarizingOnly };

// The table access method's update of a row, waiting for a concurrent
// change of it (a row the caller has locked has none).
inline TM_Result update_row_waiting(Relation relation, ItemPointer tid, TupleTableSlot* row,
                                    CommandId command, Snapshot snapshot, TM_FailureData* failure,
                                    LockTupleMode* mode, NewIndexEntries* entries) {
#if PG_VERSION_NUM >= 160000
    TU_UpdateIndexes which = TU_None;
    const TM_Result result = table_tuple_update(relation, tid, row, command, snapshot,
                                                InvalidSnapshot, true, failure, mode, &which);
    *entries = which == TU_None     ? NewIndexEntries::None
               : which == TU_All    ? NewIndexEntries::All
                                    : NewIndexEntries::SummarizingOnly;
#else
    bool all = false;
    const TM_Result result = table_tuple_update(relation, tid, row, command, snapshot,
                                                InvalidSnapshot, true, failure, mode, &all);
    *entries = all ? NewIndexEntries::All : NewIndexEntries::None;
#endif
    return result;
}

// The index entries of the new version of an updated row.
inline List* insert_updated_row_index_entries(ResultRelInfo* target, TupleTableSlot* row,
                                              EState* estate, NewIndexEntries entries) {
    if (target->ri_NumIndices == 0 || entries == NewIndexEntries::None) return NIL;
#if PG_VERSION_NUM >= 160000
    return ExecInsertIndexTuples(target, row, estate, true, false, nullptr, NIL,
                                 entries == NewIndexEntries::SummarizingOnly);
#else
    return ExecInsertIndexTuples(target, row, estate, true, false, nullptr, NIL);
#endif
}

// The index entries of an inserted row; with `arbiters`, a speculative
// insertion's (a conflict in one of them sets *speculative_conflict).
inline List* insert_index_entries(ResultRelInfo* target, TupleTableSlot* slot, EState* estate,
                                  bool* speculative_conflict, List* arbiters) {
#if PG_VERSION_NUM >= 160000
    return ExecInsertIndexTuples(target, slot, estate, false, true, speculative_conflict, arbiters,
                                 false);
#else
    return ExecInsertIndexTuples(target, slot, estate, false, true, speculative_conflict, arbiters);
#endif
}

// The index entries of an inserted row, as INSERT makes them (a unique
// index raises its violation).
inline List* insert_new_row_index_entries(ResultRelInfo* target, TupleTableSlot* slot,
                                          EState* estate) {
#if PG_VERSION_NUM >= 160000
    return ExecInsertIndexTuples(target, slot, estate, false, false, nullptr, NIL, false);
#else
    return ExecInsertIndexTuples(target, slot, estate, false, false, nullptr, NIL);
#endif
}

// The relation's primary key index (InvalidOid: none).
inline Oid primary_key_index(Relation relation) {
#if PG_VERSION_NUM >= 180000
    return RelationGetPrimaryKeyIndex(relation, false);
#else
    return RelationGetPrimaryKeyIndex(relation);
#endif
}

inline IndexScanDesc begin_index_scan(Relation table, Relation index, Snapshot snapshot,
                                      int nkeys) {
#if PG_VERSION_NUM >= 180000
    return index_beginscan(table, index, snapshot, nullptr, nkeys, 0);
#else
    return index_beginscan(table, index, snapshot, nkeys, 0);
#endif
}

// The tuple lock of `tid` in `mode` if no one holds it, without waiting
// (and, from PostgreSQL 18 on, without logging the miss).
inline bool try_lock_tuple(Relation relation, ItemPointer tid, LOCKMODE mode) {
#if PG_VERSION_NUM >= 180000
    return ConditionalLockTuple(relation, tid, mode, false);
#else
    return ConditionalLockTuple(relation, tid, mode);
#endif
}

// This backend's number among the server's processes (its PGPROC's).
inline int my_proc_number() {
#if PG_VERSION_NUM >= 170000
    return MyProcNumber;
#else
    return MyProc->pgprocno;
#endif
}

// Whether transaction `xid` has ended, without waiting for it.
inline bool transaction_ended(TransactionId xid) {
#if PG_VERSION_NUM >= 180000
    return ConditionalXactLockTableWait(xid, false);
#else
    return ConditionalXactLockTableWait(xid);
#endif
}

}  // namespace idem::pg
