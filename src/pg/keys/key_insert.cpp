#include "pg/keys/key_insert.hpp"

#include <algorithm>
#include <cstring>

#include "pg/boundary/extension_objects.hpp"
#include "pg/boundary/spi.hpp"
#include "pg/boundary/status_enum.hpp"

extern "C" {
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

// Where each column of the table is (0 when the installed version has none).
struct Columns {
    AttrNumber scope, key, status, token, attempts, lease_until, fingerprint, created_at,
        updated_at, claimed_at, holder_pid, registered, lease_expired, job_ref, max_attempts,
        retention, active_since;
};

Columns columns;
Oid columns_of_table = InvalidOid;
std::uint64_t columns_generation = 0;

AttrNumber column_named(TupleDesc desc, const char* name) {
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        if (!attribute->attisdropped && std::strcmp(NameStr(attribute->attname), name) == 0)
            return attribute->attnum;
    }
    return 0;
}

const Columns& columns_of(Relation table, std::uint64_t generation) {
    if (columns_of_table == RelationGetRelid(table) && columns_generation == generation)
        return columns;
    const TupleDesc desc = RelationGetDescr(table);
    columns = Columns{column_named(desc, "scope"),        column_named(desc, "key"),
                      column_named(desc, "status"),       column_named(desc, "token"),
                      column_named(desc, "attempts"),     column_named(desc, "lease_until"),
                      column_named(desc, "fingerprint"),  column_named(desc, "created_at"),
                      column_named(desc, "updated_at"),   column_named(desc, "claimed_at"),
                      column_named(desc, "holder_pid"),   column_named(desc, "registered"),
                      column_named(desc, "lease_expired"), column_named(desc, "job_ref"),
                      column_named(desc, "max_attempts"), column_named(desc, "retention"),
                      column_named(desc, "active_since")};
    columns_of_table = RelationGetRelid(table);
    columns_generation = generation;
    return columns;
}

void set(TupleTableSlot* slot, AttrNumber column, Datum value) {
    if (column == 0) return;
    slot->tts_values[column - 1] = value;
    slot->tts_isnull[column - 1] = false;
}

Datum interval_datum(Micros value) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = value;
    return IntervalPGetDatum(interval);
}

// The new row, as the table's columns are laid out.
void fill_row(TupleTableSlot* slot, const Columns& at, const NewKey& key, Oid status_type,
              std::int64_t token) {
    ExecClearTuple(slot);
    const int natts = slot->tts_tupleDescriptor->natts;
    for (int i = 0; i < natts; ++i) {
        slot->tts_values[i] = 0;
        slot->tts_isnull[i] = true;
    }
    const bool claim = key.status == Status::Processing;
    set(slot, at.scope, PointerGetDatum(key.scope));
    set(slot, at.key, PointerGetDatum(key.key));
    set(slot, at.status, status_datum(status_type, key.status));
    if (key.has_fingerprint) set(slot, at.fingerprint, key.fingerprint);
    set(slot, at.created_at, TimestampTzGetDatum(key.now));
    set(slot, at.updated_at, TimestampTzGetDatum(key.now));
    set(slot, at.attempts, Int32GetDatum(claim ? 1 : 0));
    set(slot, at.registered, BoolGetDatum(!claim));
    set(slot, at.lease_expired, BoolGetDatum(false));
    // A new key is live, registered or claimed: the sweeps find it (0.6.0 on).
    set(slot, at.active_since, TimestampTzGetDatum(key.now));
    if (claim) {
        set(slot, at.token, Int64GetDatum(token));
        set(slot, at.lease_until, TimestampTzGetDatum(key.lease_until));
        set(slot, at.claimed_at, TimestampTzGetDatum(key.now));
        set(slot, at.holder_pid, Int32GetDatum(MyProcPid));
        set(slot, at.max_attempts, Int32GetDatum(key.max_attempts));
        set(slot, at.retention, interval_datum(key.retention));
    } else if (key.job_ref != nullptr) {
        set(slot, at.job_ref, PointerGetDatum(key.job_ref));
    }
    ExecStoreVirtualTuple(slot);
}

Relation primary_key_of(const ResultRelInfo* target) {
    for (int i = 0; i < target->ri_NumIndices; ++i)
        if (target->ri_IndexRelationDescs[i]->rd_index->indisprimary)
            return target->ri_IndexRelationDescs[i];
    elog(ERROR, "idempotency: the keys table has no primary key");
    return nullptr;
}

// What the primary key holds for the key, read as it is now, including the
// changes of transactions that have not ended (a dirty read): a row that
// such a transaction inserts or deletes makes the key Busy; a live row makes
// it Exists; none leaves it free (Inserted, for the caller to try).
KeyInsert probe(Relation table, Relation primary_key, const NewKey& key, TransactionId* busy) {
    SnapshotData dirty;
    InitDirtySnapshot(dirty);
    ScanKeyData scan_keys[2];
    const Datum values[2] = {PointerGetDatum(key.scope), PointerGetDatum(key.key)};
    for (int i = 0; i < 2; ++i)
        ScanKeyEntryInitialize(&scan_keys[i], 0, static_cast<AttrNumber>(i + 1),
                               BTEqualStrategyNumber, InvalidOid,
                               primary_key->rd_indcollation[i], F_TEXTEQ, values[i]);
    IndexScanDesc scan = begin_index_scan(table, primary_key, &dirty, 2);
    index_rescan(scan, scan_keys, 2, nullptr, 0);
    TupleTableSlot* slot = table_slot_create(table, nullptr);
    KeyInsert found = KeyInsert::Inserted;
    if (index_getnext_slot(scan, ForwardScanDirection, slot)) {
        const TransactionId other = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
        found = TransactionIdIsValid(other) ? KeyInsert::Busy : KeyInsert::Exists;
        *busy = other;
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(slot);
    return found;
}

}  // namespace

KeyInsertResult insert_key(const NewKey& key) {
    const ExtensionObjects& objects = extension_objects();
    Relation table = table_open(objects.keys, RowExclusiveLock);
    EState* estate = CreateExecutorState();
    init_single_range_table(estate, table, RowExclusiveLock);
    ResultRelInfo* target = makeNode(ResultRelInfo);
    InitResultRelInfo(target, table, 1, nullptr, 0);
    estate->es_output_cid = GetCurrentCommandId(true);
    ExecOpenIndices(target, true);
    Relation primary_key = primary_key_of(target);
    List* arbiters = list_make1_oid(RelationGetRelid(primary_key));
    const TriggerDesc* triggers = target->ri_TrigDesc;
    const bool after_triggers = triggers != nullptr && triggers->trig_insert_after_row;
    if (after_triggers) AfterTriggerBeginQuery();

    KeyInsertResult result{KeyInsert::Exists, 0, InvalidTransactionId};
    TupleTableSlot* slot = ExecInitExtraTupleSlot(estate, RelationGetDescr(table), &TTSOpsVirtual);
    const bool claim = key.status == Status::Processing;
    result.token = claim ? nextval_internal(objects.token_seq, false) : 0;
    fill_row(slot, columns_of(table, objects.generation), key, objects.status_type, result.token);
    // As an INSERT ... ON CONFLICT does, before-row triggers fire once,
    // whether the row is then inserted or not.
    bool wanted = true;
    if (triggers != nullptr && triggers->trig_insert_before_row)
        wanted = ExecBRInsertTriggers(estate, target, slot);
    if (!wanted) elog(ERROR, "idempotency: a trigger on the keys table refused a new key");
    if (table->rd_att->constr != nullptr) ExecConstraints(target, slot, estate);

    for (;;) {
        CHECK_FOR_INTERRUPTS();
        result.outcome = probe(table, primary_key, key, &result.busy_with);
        if (result.outcome != KeyInsert::Inserted) break;
        const TransactionId self = GetCurrentTransactionId();
        const uint32 token = SpeculativeInsertionLockAcquire(self);
        table_tuple_insert_speculative(table, slot, estate->es_output_cid, 0, nullptr, token);
        bool conflict = false;
        List* recheck = insert_index_entries(target, slot, estate, &conflict, arbiters);
        table_tuple_complete_speculative(table, slot, token, !conflict);
        SpeculativeInsertionLockRelease(self);
        if (!conflict) {
            if (after_triggers) ExecARInsertTriggers(estate, target, slot, recheck, nullptr);
            break;
        }
        // Another transaction inserted the key meanwhile: ours is taken
        // back, and the probe finds theirs.
        list_free(recheck);
    }
    if (after_triggers) AfterTriggerEndQuery(estate);
    ExecCloseIndices(target);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
    table_close(table, NoLock);  // the lock is kept to the transaction's end, as a statement's
    if (result.outcome == KeyInsert::Inserted) CommandCounterIncrement();
    return result;
}

bool wait_for_end(TransactionId xid, Micros deadline) {
    const Micros left = deadline - GetCurrentTimestamp();
    if (left <= 0) return transaction_ended(xid);
    return wait_for_transaction(xid, left);
}

}  // namespace idem::pg
