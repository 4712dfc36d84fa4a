#include "pg/outbox_index.hpp"

#include <algorithm>

#include "pg/extension_objects.hpp"
#include "pg/outbox_store.hpp"

extern "C" {
#include "access/genam.h"
#include "access/skey.h"
#include "access/table.h"
#include "catalog/index.h"
#include "executor/tuptable.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

// The outbox's ready-queue indexes and the columns read, for one
// generation of the extension's objects.
struct Layout {
    std::uint64_t generation;
    Oid ready;      // (topic, ready_at, id) WHERE ready_at IS NOT NULL
    Oid ready_all;  // (ready_at, id) WHERE ready_at IS NOT NULL
    Oid key_order;  // (topic, key, COALESCE(key_seq, id), id) WHERE live AND key IS NOT NULL
    AttrNumber id, ready_at, state, attempts, max_attempts, key_seq;
    Datum pending, in_flight;
};

Layout known{};

Oid outbox_index(const ExtensionObjects& objects, const char* name) {
    const Oid index = get_relname_relid(name, objects.schema);
    if (!OidIsValid(index) || get_rel_relkind(index) != RELKIND_INDEX ||
        IndexGetRelation(index, false) != objects.outbox)
        elog(ERROR, "idempotency: the outbox has no index %s: update the extension", name);
    return index;
}

AttrNumber outbox_column(const ExtensionObjects& objects, const char* name) {
    const AttrNumber column = get_attnum(objects.outbox, name);
    if (column == InvalidAttrNumber)
        elog(ERROR, "idempotency: the outbox has no column %s: update the extension", name);
    return column;
}

const Layout& layout() {
    const ExtensionObjects& objects = extension_objects();
    if (known.generation == objects.generation) return known;
    Layout found{};
    found.ready = outbox_index(objects, "outbox_ready");
    found.ready_all = outbox_index(objects, "outbox_ready_all");
    found.key_order = outbox_index(objects, "outbox_key_order");
    found.id = outbox_column(objects, "id");
    found.ready_at = outbox_column(objects, "ready_at");
    found.state = outbox_column(objects, "state");
    found.attempts = outbox_column(objects, "attempts");
    found.max_attempts = outbox_column(objects, "max_attempts");
    found.key_seq = outbox_column(objects, "key_seq");
    found.pending = outbox_state_value("pending");
    found.in_flight = outbox_state_value("in_flight");
    found.generation = objects.generation;
    known = found;
    return known;
}

void key(ScanKeyData* out, Relation index, AttrNumber column, StrategyNumber strategy,
         RegProcedure procedure, Datum value) {
    ScanKeyEntryInitialize(out, 0, column, strategy, InvalidOid,
                           index->rd_indcollation[column - 1], procedure, value);
}

// Runs `visit` on each visible row the index scan returns, with a snapshot
// taken now, until it returns false. Only trivially destructible locals:
// an error may leave from anywhere (the abort releases what is open).
template <typename Visit>
void scan(Oid index_oid, ScanDirection direction, int nkeys, void (*keys)(ScanKeyData*, Relation, void*),
          void* key_context, Visit visit) {
    const ExtensionObjects& objects = extension_objects();
    Relation heap = table_open(objects.outbox, AccessShareLock);
    Relation index = index_open(index_oid, AccessShareLock);
    ScanKeyData scan_keys[4];
    keys(scan_keys, index, key_context);
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    IndexScanDesc walk = begin_index_scan(heap, index, snapshot, nkeys);
    index_rescan(walk, scan_keys, nkeys, nullptr, 0);
    TupleTableSlot* slot = table_slot_create(heap, nullptr);
    while (index_getnext_slot(walk, direction, slot))
        if (!visit(slot)) break;
    ExecDropSingleTupleTableSlot(slot);
    index_endscan(walk);
    UnregisterSnapshot(snapshot);
    index_close(index, AccessShareLock);
    table_close(heap, AccessShareLock);
}

struct ReadyKeys {
    const text* topic;
    Micros from;
    Micros now;
};

void ready_keys(ScanKeyData* out, Relation index, void* context) {
    const ReadyKeys* k = static_cast<const ReadyKeys*>(context);
    int n = 0;
    AttrNumber column = 1;
    if (k->topic != nullptr)
        key(&out[n++], index, column++, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(k->topic));
    key(&out[n++], index, column, BTGreaterEqualStrategyNumber, F_TIMESTAMPTZ_GE,
        TimestampTzGetDatum(k->from));
    key(&out[n], index, column, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
        TimestampTzGetDatum(k->now));
}

struct KeyOrderKeys {
    const text* topic;
    const text* key;
    std::int64_t place;
    StrategyNumber strategy;
    RegProcedure procedure;
};

void key_order_keys(ScanKeyData* out, Relation index, void* context) {
    const KeyOrderKeys* k = static_cast<const KeyOrderKeys*>(context);
    key(&out[0], index, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(k->topic));
    key(&out[1], index, 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(k->key));
    key(&out[2], index, 3, k->strategy, k->procedure, Int64GetDatum(k->place));
}

Datum attribute(TupleTableSlot* slot, AttrNumber column, bool* isnull) {
    return slot_getattr(slot, column, isnull);
}

// The transaction that locked or changed the row version, if a plain one.
TransactionId holder_of(TupleTableSlot* slot) {
    bool should_free = false;
    HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
    const HeapTupleHeader header = tuple->t_data;
    TransactionId xmax = InvalidTransactionId;
    if (!(header->t_infomask & HEAP_XMAX_INVALID) && !(header->t_infomask & HEAP_XMAX_IS_MULTI))
        xmax = HeapTupleHeaderGetRawXmax(header);
    if (should_free) heap_freetuple(tuple);
    return xmax;
}

bool is_live(const Layout& l, TupleTableSlot* slot, bool* pending) {
    bool isnull = false;
    const Datum state = attribute(slot, l.state, &isnull);
    *pending = state == l.pending;
    return state == l.pending || state == l.in_flight;
}

bool skipped(std::int64_t id, const std::int64_t* skip, int count) {
    int low = 0;
    int high = count;
    while (low < high) {
        const int mid = (low + high) / 2;
        if (skip[mid] < id)
            low = mid + 1;
        else
            high = mid;
    }
    return low < count && skip[low] == id;
}

KeyEvent key_event(const Layout& l, TupleTableSlot* slot, bool pending) {
    bool isnull = false;
    KeyEvent event{};
    event.found = true;
    event.id = DatumGetInt64(attribute(slot, l.id, &isnull));
    const Datum seq = attribute(slot, l.key_seq, &isnull);
    event.place = isnull ? event.id : DatumGetInt64(seq);
    (void)attribute(slot, l.ready_at, &isnull);
    event.ready = !isnull;
    event.pending = pending;
    return event;
}

}  // namespace

int read_ready(const text* topic, Micros from, Micros after_at, std::int64_t after_id, Micros now,
               int max_attempts, int limit, ReadyRow* out, Micros* seen_at,
               std::int64_t* seen_id) {
    const Layout& l = layout();
    ReadyKeys keys{topic, std::max(from, after_at), now};
    int count = 0;
    scan(topic != nullptr ? l.ready : l.ready_all, ForwardScanDirection, topic != nullptr ? 3 : 2,
         ready_keys, &keys, [&](TupleTableSlot* slot) {
             bool isnull = false;
             const Datum ready = attribute(slot, l.ready_at, &isnull);
             if (isnull) return true;  // changed since the entry was made
             const Micros ready_at = DatumGetTimestampTz(ready);
             const std::int64_t id = DatumGetInt64(attribute(slot, l.id, &isnull));
             if (ready_at < after_at || (ready_at == after_at && id <= after_id)) return true;
             *seen_at = ready_at;
             *seen_id = id;
             bool pending = false;
             if (!is_live(l, slot, &pending)) return true;
             if (!pending) {
                 const std::int32_t attempts = DatumGetInt32(attribute(slot, l.attempts, &isnull));
                 const Datum cap = attribute(slot, l.max_attempts, &isnull);
                 if (attempts >= (isnull ? max_attempts : DatumGetInt32(cap))) return true;
             }
             ReadyRow& row = out[count++];
             row.id = id;
             row.ready_at = ready_at;
             row.xmax = holder_of(slot);
             ItemPointerCopy(&slot->tts_tid, &row.ctid);
             return count < limit;
         });
    return count;
}

KeyEvent first_event_from(const text* topic, const text* key, std::int64_t place,
                          const std::int64_t* skip, int skip_count) {
    const Layout& l = layout();
    KeyOrderKeys keys{topic, key, place, BTGreaterEqualStrategyNumber, F_INT8GE};
    KeyEvent found{};
    scan(l.key_order, ForwardScanDirection, 3, key_order_keys, &keys, [&](TupleTableSlot* slot) {
        bool pending = false;
        if (!is_live(l, slot, &pending)) return true;
        const KeyEvent event = key_event(l, slot, pending);
        if (skip_count > 0 && skipped(event.id, skip, skip_count)) return true;
        found = event;
        return false;
    });
    return found;
}

int key_events_from(const text* topic, const text* key, std::int64_t place, std::int64_t after_id,
                    KeyEvent* out, int limit) {
    const Layout& l = layout();
    KeyOrderKeys keys{topic, key, place, BTGreaterEqualStrategyNumber, F_INT8GE};
    int count = 0;
    scan(l.key_order, ForwardScanDirection, 3, key_order_keys, &keys, [&](TupleTableSlot* slot) {
        bool pending = false;
        if (!is_live(l, slot, &pending)) return true;
        const KeyEvent event = key_event(l, slot, pending);
        if (event.place == place && event.id <= after_id) return true;
        out[count++] = event;
        return count < limit;
    });
    return count;
}

KeyEvent last_event_before(const text* topic, const text* key, std::int64_t place) {
    const Layout& l = layout();
    KeyOrderKeys keys{topic, key, place, BTLessStrategyNumber, F_INT8LT};
    KeyEvent found{};
    scan(l.key_order, BackwardScanDirection, 3, key_order_keys, &keys, [&](TupleTableSlot* slot) {
        bool pending = false;
        if (!is_live(l, slot, &pending)) return true;
        found = key_event(l, slot, pending);
        return false;
    });
    return found;
}

}  // namespace idem::pg
