#include "pg/keys/tombstone_store.hpp"

#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/status_enum.hpp"
#include "pg/keys/tombstone_digest.hpp"

extern "C" {
#include "access/table.h"
#include "access/xact.h"
#include "storage/bufmgr.h"
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

// The table's columns, in the order both install paths create them.
enum TombstoneColumn : AttrNumber { kKeyDigest = 1, kForgetAt, kFingerprint, kStatus };

// Tombstones are found through a block range index on forget_at: rows
// arrive in about that order, so the ranges due are the oldest pages, and
// no order fits that index (the sweeps' other statements order by theirs).
Statement kPurgeTombstones = {
    "DELETE FROM @tombstones@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @tombstones@ WHERE forget_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

// The columns are read by place: both install paths create them in this
// order. A table changed by hand is refused rather than misread.
void check_columns(TupleDesc desc) {
    static const char* const kNames[] = {"key_digest", "forget_at", "fingerprint", "status"};
    for (int i = 0; i < 4; ++i)
        if (desc->natts < 4 || TupleDescAttr(desc, i)->attisdropped ||
            std::strcmp(NameStr(TupleDescAttr(desc, i)->attname), kNames[i]) != 0)
            elog(ERROR, "idempotency: the tombstones table does not have the columns of 0.7.0");
}

// Whether the table has never held a row: a relation of no block. A purge
// that moves a key extends the table before it commits, so a claim that
// waited for it (its insert met the purged key) sees a block here.
bool never_held_a_row(Oid tombstones) {
    Relation heap = table_open(tombstones, AccessShareLock);
    const bool empty = RelationGetNumberOfBlocks(heap) == 0;
    table_close(heap, NoLock);  // the lock stays until the transaction ends
    return empty;
}

}  // namespace

bool read_tombstone(const KeyId& id, Tombstone* out) {
    const ExtensionObjects& objects = extension_objects();
    if (!OidIsValid(objects.tombstones) || never_held_a_row(objects.tombstones)) return false;
    OpenTable table = open_to_read(objects.tombstones);
    const Datum digest = tombstone_digest(id);
    const bool found = find_row(&table, &digest, RowLock::None);
    if (found) {
        check_columns(RelationGetDescr(table.heap));
        slot_getallattrs(table.found);
        const Datum* values = table.found->tts_values;
        const bool* nulls = table.found->tts_isnull;
        out->status = status_from_datum(objects.status_type, values[kStatus - 1]);
        out->forget_at = DatumGetTimestampTz(values[kForgetAt - 1]);
        out->has_fingerprint = !nulls[kFingerprint - 1];
        out->fingerprint_prefix = out->has_fingerprint ? DatumGetInt32(values[kFingerprint - 1]) : 0;
    }
    close_table(&table);
    return found;
}

void refuse_if_tombstone_made_since_snapshot(const KeyId& id) {
    if (!IsolationUsesXactSnapshot()) return;
    const ExtensionObjects& objects = extension_objects();
    if (!OidIsValid(objects.tombstones) || never_held_a_row(objects.tombstones)) return;
    OpenTable table = open_to_read(objects.tombstones);
    const Datum digest = tombstone_digest(id);
    const bool made = row_changed_since_snapshot(&table, &digest);
    close_table(&table);
    if (made) throw_changed_since_snapshot(id, "it was finished and purged into its tombstone");
}

std::uint64_t purge_tombstones(int batch) {
    return execute_due(kPurgeTombstones, GetCurrentTimestamp(), batch);
}

}  // namespace idem::pg
