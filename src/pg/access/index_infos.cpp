#include "pg/access/index_infos.hpp"

#include "pg/boundary/guard.hpp"

extern "C" {
#include "catalog/index.h"
#include "catalog/pg_am_d.h"
#include "optimizer/optimizer.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

// One kept IndexInfo. `users` counts the writes using it; a retired entry
// (its index changed) is freed once none does.
struct Kept {
    Oid index;
    bool valid;
    int users;
    MemoryContext memory;
    IndexInfo* info;
};

constexpr int kKept = 32;
Kept kept[kKept];
bool callbacks_installed = false;

void retire(Datum, Oid relation) {
    for (Kept& entry : kept)
        if (entry.info != nullptr && (relation == InvalidOid || relation == entry.index))
            entry.valid = false;
}

// At the end of a transaction no write is under way: an error may have left
// counts of writes that never closed.
void on_transaction_end(XactEvent event, void*) {
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
        event != XACT_EVENT_PARALLEL_COMMIT && event != XACT_EVENT_PARALLEL_ABORT &&
        event != XACT_EVENT_PREPARE)
        return;
    for (Kept& entry : kept) entry.users = 0;
}

void install_callbacks() {
    if (callbacks_installed) return;
    CacheRegisterRelcacheCallback(retire, 0);
    register_guarded_callback(on_transaction_end);
    callbacks_installed = true;
}

void free_entry(Kept& entry) {
    MemoryContextDelete(entry.memory);
    entry = Kept{};
}

// The IndexInfo as ExecOpenIndices builds it for a speculative insertion,
// with the predicate and expressions made ready as ExecInsertIndexTuples
// and FormIndexDatum would make them on first use.
IndexInfo* build(Relation index) {
    IndexInfo* info = BuildIndexInfo(index);
    if (info->ii_Unique && !index->rd_index->indisexclusion) BuildSpeculativeIndexInfo(index, info);
    if (info->ii_Predicate != NIL)
        info->ii_PredicateState = ExecInitQual(reinterpret_cast<List*>(expression_planner(
                                                   reinterpret_cast<Expr*>(info->ii_Predicate))),
                                               nullptr);
    List* states = NIL;
    ListCell* cell;
    foreach (cell, info->ii_Expressions)
        states = lappend(
            states, ExecInitExpr(expression_planner(static_cast<Expr*>(lfirst(cell))), nullptr));
    info->ii_ExpressionsState = states;
    return info;
}

IndexInfo* kept_info(Relation index) {
    const Oid oid = RelationGetRelid(index);
    Kept* free_slot = nullptr;
    for (Kept& entry : kept) {
        if (entry.info == nullptr) {
            if (free_slot == nullptr) free_slot = &entry;
            continue;
        }
        if (!entry.valid && entry.users == 0) {
            free_entry(entry);
            if (free_slot == nullptr) free_slot = &entry;
            continue;
        }
        if (entry.valid && entry.index == oid) {
            ++entry.users;
            // Set per update statement by the executor (whether the update
            // changed the index's columns): worked out afresh for this write.
            entry.info->ii_CheckedUnchanged = false;
            return entry.info;
        }
    }
    if (free_slot == nullptr) return nullptr;  // all in use: built per call
    MemoryContext memory =
        AllocSetContextCreate(CacheMemoryContext, "idempotency index info", ALLOCSET_SMALL_SIZES);
    MemoryContext caller = MemoryContextSwitchTo(memory);
    IndexInfo* info = build(index);
    MemoryContextSwitchTo(caller);
    *free_slot = Kept{oid, true, 1, memory, info};
    return info;
}

void give_back(const IndexInfo* info) {
    for (Kept& entry : kept)
        if (entry.info == info && entry.users > 0) {
            --entry.users;
            return;
        }
}

}  // namespace

void open_indexes(ResultRelInfo* target) {
    install_callbacks();
    Relation heap = target->ri_RelationDesc;
    target->ri_NumIndices = 0;
    if (!RelationGetForm(heap)->relhasindex) return;
    List* oids = RelationGetIndexList(heap);
    const int count = list_length(oids);
    if (count == 0) return;
    target->ri_IndexRelationDescs = static_cast<RelationPtr>(palloc(sizeof(Relation) * count));
    target->ri_IndexRelationInfo = static_cast<IndexInfo**>(palloc(sizeof(IndexInfo*) * count));
    int i = 0;
    ListCell* cell;
    foreach (cell, oids) {
        Relation index = index_open(lfirst_oid(cell), RowExclusiveLock);
        IndexInfo* info = index->rd_rel->relam == BTREE_AM_OID ? kept_info(index) : nullptr;
        if (info == nullptr) {
            info = BuildIndexInfo(index);
            if (info->ii_Unique && !index->rd_index->indisexclusion)
                BuildSpeculativeIndexInfo(index, info);
        }
        target->ri_IndexRelationDescs[i] = index;
        target->ri_IndexRelationInfo[i] = info;
        target->ri_NumIndices = ++i;
    }
    list_free(oids);
}

void close_indexes(ResultRelInfo* target) {
    for (int i = 0; i < target->ri_NumIndices; ++i) give_back(target->ri_IndexRelationInfo[i]);
    ExecCloseIndices(target);
}

}  // namespace idem::pg
