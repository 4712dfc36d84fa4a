#include "pg/keys/tombstone_store.hpp"

#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/spi.hpp"
#include "pg/access/status_enum.hpp"

namespace idem::pg {

namespace {

// A column of the open table by name: six columns, no catalog lookup.
AttrNumber column_named(Relation table, const char* name) {
    const TupleDesc desc = RelationGetDescr(table);
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        if (!attribute->attisdropped && std::strcmp(NameStr(attribute->attname), name) == 0)
            return static_cast<AttrNumber>(i + 1);
    }
    elog(ERROR, "idempotency: the tombstones table has no column %s", name);
    pg_unreachable();
}

// Tombstones are found through a block range index on forget_at: rows
// arrive in about that order, so the ranges due are the oldest pages, and
// no order fits that index (the sweeps' other statements order by theirs).
Statement kPurgeTombstones = {
    "DELETE FROM @tombstones@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @tombstones@ WHERE forget_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

}  // namespace

bool read_tombstone(const KeyId& id, Tombstone* out) {
    const ExtensionObjects& objects = extension_objects();
    if (!OidIsValid(objects.tombstones)) return false;
    OpenTable table = open_to_read(objects.tombstones);
    const KeyIdValues key = key_id_values(id);
    const bool found = find_row(&table, key.values, RowLock::None);
    if (found) {
        bool isnull = false;
        const Datum status = slot_getattr(table.found, column_named(table.heap, "status"), &isnull);
        out->status = status_from_datum(objects.status_type, status);
        const Datum fingerprint =
            slot_getattr(table.found, column_named(table.heap, "fingerprint"), &isnull);
        out->has_fingerprint = !isnull;
        out->fingerprint = isnull ? 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(fingerprint));
    }
    close_table(&table);
    return found;
}

std::uint64_t purge_tombstones(int batch) {
    return execute_due(kPurgeTombstones, GetCurrentTimestamp(), batch);
}

}  // namespace idem::pg
