#include "pg/keys/key_insert.hpp"

#include <algorithm>
#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/sql_row_writes.hpp"
#include "pg/keys/key_row.hpp"

extern "C" {
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

// What the primary key holds for the key, read as it is now, including the
// changes of transactions that have not ended (a dirty read): a row that
// such a transaction inserts or deletes makes the key Busy; a live row makes
// it Exists; none leaves it free (Inserted, for the caller to try).
KeyInsert probe(Relation table, Relation primary_key, const NewKey& key, TransactionId* busy) {
    SnapshotData dirty;
    InitDirtySnapshot(dirty);
    ScanKeyData scan_keys[kKeyIdColumns];
    const KeyIdValues values = key_id_values(key.id);
    for (int i = 0; i < kKeyIdColumns; ++i)
        ScanKeyEntryInitialize(&scan_keys[i], 0, static_cast<AttrNumber>(i + 1),
                               BTEqualStrategyNumber, InvalidOid, primary_key->rd_indcollation[i],
                               F_TEXTEQ, values.values[i]);
    IndexScanDesc scan = begin_index_scan(table, primary_key, &dirty, kKeyIdColumns);
    index_rescan(scan, scan_keys, kKeyIdColumns, nullptr, 0);
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

bool same_text(TupleTableSlot* row, AttrNumber column, const text* wanted) {
    bool isnull = false;
    const Datum value = slot_getattr(row, column, &isnull);
    if (isnull) return false;
    const text* stored = DatumGetTextPP(value);
    const std::size_t size = VARSIZE_ANY_EXHDR(stored);
    return size == VARSIZE_ANY_EXHDR(wanted) &&
           std::memcmp(VARDATA_ANY(stored), VARDATA_ANY(wanted), size) == 0;
}

// The insert is speculative on the key the call names: a trigger that gave
// the row another key would make the call answer for a key it did not
// insert (or, were that key taken, probe and insert again forever).
void refuse_changed_key(TupleTableSlot* row, const KeyColumns& at, const NewKey& key,
                        Relation table) {
    if (same_text(row, at.scope, key.id.scope) && same_text(row, at.key, key.id.key)) return;
    ereport(ERROR,
            (errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
             errmsg("a trigger on table \"%s\" changed the scope or key of a new key",
                    RelationGetRelationName(table)),
             errdetail("The call is for key \"%s\" of scope \"%s\".", text_to_cstring(key.id.key),
                       text_to_cstring(key.id.scope)),
             errhint("A BEFORE INSERT trigger on the keys table must leave scope and key as "
                     "they are.")));
}

}  // namespace

KeyInsertResult insert_key(const NewKey& key) {
    const ExtensionObjects& objects = extension_objects();
    OpenTable open = open_to_write(objects.keys);  // found by its primary key
    Relation table = open.heap;
    EState* estate = open.estate;
    ResultRelInfo* target = open.target;
    Relation primary_key = open.index;

    // The probe comes first: a key that exists costs no sequence value, no
    // trigger and no row.
    KeyInsertResult result{KeyInsert::Exists, 0, InvalidTransactionId};
    result.outcome = probe(table, primary_key, key, &result.busy_with);
    if (result.outcome == KeyInsert::Inserted && open.via_sql) {
        // The differential test's other way: INSERT ... ON CONFLICT (scope,
        // key) DO NOTHING RETURNING, with the row computed as below.
        TupleTableSlot* slot = new_row(&open);
        const bool claim = key.status == Status::Processing;
        result.token = claim ? nextval_internal(objects.token_seq, false) : 0;
        KeyWrite write{};
        write.row = slot;
        write.at = &key_columns(table);
        write.status_type = objects.status_type;
        write_new_key(&write, key, result.token);
        if (sql_rows::insert(table, slot, RelationGetRelid(primary_key))) {
            open.wrote = true;
            refuse_changed_key(slot, *write.at, key, table);  // the row the INSERT returned
        } else {
            // Nothing inserted: a conflict, or a BEFORE trigger that skipped
            // the row or changed its key. Only the first leaves the key taken.
            result.outcome = probe(table, primary_key, key, &result.busy_with);
            if (result.outcome == KeyInsert::Inserted)
                elog(ERROR, "idempotency: a trigger on the keys table refused a new key");
        }
    } else if (result.outcome == KeyInsert::Inserted) {
        List* arbiters = list_make1_oid(RelationGetRelid(primary_key));
        TriggerDesc* triggers = target->ri_TrigDesc;
        TransitionCaptureState* capture = start_statement(&open, CMD_INSERT);
        TupleTableSlot* slot = new_row(&open);
        const bool claim = key.status == Status::Processing;
        result.token = claim ? nextval_internal(objects.token_seq, false) : 0;
        KeyWrite write{};
        write.row = slot;
        write.at = &key_columns(table);
        write.status_type = objects.status_type;
        write_new_key(&write, key, result.token);
        fill_defaults_of(&open, slot);
        // Before-row triggers fire once, as for an INSERT ... ON CONFLICT
        // that inserts.
        bool wanted = true;
        if (triggers != nullptr && triggers->trig_insert_before_row)
            wanted = ExecBRInsertTriggers(estate, target, slot);
        if (!wanted) elog(ERROR, "idempotency: a trigger on the keys table refused a new key");
        refuse_changed_key(slot, *write.at, key, table);
        check_row(&open, slot, CMD_INSERT);

        for (;;) {
            CHECK_FOR_INTERRUPTS();
            const TransactionId self = GetCurrentTransactionId();
            const uint32 token = SpeculativeInsertionLockAcquire(self);
            table_tuple_insert_speculative(table, slot, estate->es_output_cid, 0, nullptr, token);
            bool conflict = false;
            List* recheck = insert_index_entries(target, slot, estate, &conflict, arbiters);
            table_tuple_complete_speculative(table, slot, token, !conflict);
            SpeculativeInsertionLockRelease(self);
            if (!conflict) {
                open.wrote = true;
                ExecARInsertTriggers(estate, target, slot, recheck, capture);
                break;
            }
            // Another transaction inserted the key meanwhile: ours is taken
            // back, and the probe finds theirs.
            list_free(recheck);
            result.outcome = probe(table, primary_key, key, &result.busy_with);
            if (result.outcome != KeyInsert::Inserted) break;
        }
    }
    close_table(&open);  // the lock is kept to the transaction's end, as a statement's
    return result;
}

bool wait_for_end(TransactionId xid, Micros deadline) {
    const Micros left = deadline - GetCurrentTimestamp();
    if (left <= 0) return transaction_ended(xid);
    return wait_for_transaction(xid, left);
}

}  // namespace idem::pg
