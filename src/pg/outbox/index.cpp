#include "pg/outbox/index.hpp"

#include <algorithm>
#include <cstring>

#include "core/retry.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/boundary/text_bytes.hpp"
#include "pg/outbox/index_shape.hpp"
#include "pg/outbox/store.hpp"

extern "C" {
#include "access/genam.h"
#include "access/skey.h"
#include "access/table.h"
#include "catalog/index.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

// The outbox's ready-queue indexes and the columns read, for one layout of
// the extension's objects (an index replaced by REINDEX CONCURRENTLY,
// dropped and created again, or renamed, is found again by its shape).
// The columns and states the indexes' shapes name are its base (their
// key_collation, of the key column, is the index expression's).
struct Layout : OutboxShapeColumns {
    std::uint64_t layout;
    Oid ready;      // (topic, ready_at, id) WHERE ready_at IS NOT NULL
    Oid ready_all;  // (ready_at, id) WHERE ready_at IS NOT NULL
    Oid key_order;  // (hash of topic and key, COALESCE(key_seq, id), id) WHERE not delivered AND keyed
    AttrNumber attempts, max_attempts;
    Oid id_sequence;
};

Layout known{};

bool fits(Oid index, OutboxIndex which, const OutboxShapeColumns& columns) {
    const ExtensionObjects& objects = extension_objects();
    if (!OidIsValid(index) || get_rel_relkind(index) != RELKIND_INDEX ||
        IndexGetRelation(index, false) != objects.outbox)
        return false;
    Relation relation = index_open(index, AccessShareLock);
    const bool shaped = has_outbox_index_shape(relation, which, columns);
    index_close(relation, AccessShareLock);
    return shaped;
}

// The index of that name when it has the shape the reads need, else any
// index of the outbox that has it (one renamed, or built by hand beside it).
Oid outbox_index(const ExtensionObjects& objects, OutboxIndex which,
                 const OutboxShapeColumns& columns) {
    const char* name = outbox_index_name(which);
    Oid index = get_relname_relid(name, objects.schema);
    if (!fits(index, which, columns)) {
        index = InvalidOid;
        Relation heap = table_open(objects.outbox, AccessShareLock);
        List* indexes = RelationGetIndexList(heap);
        table_close(heap, AccessShareLock);
        ListCell* cell = nullptr;
        foreach (cell, indexes) {
            if (fits(lfirst_oid(cell), which, columns)) {
                index = lfirst_oid(cell);
                break;
            }
        }
    }
    if (!OidIsValid(index))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency: the outbox has no index of the definition of %s", name),
                        errhint("Create it again as the extension defines it: %s.",
                                outbox_index_definition(which))));
    watch_relation(index);
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
    if (known.layout == objects.layout) return known;
    Layout found{};
    found.id = outbox_column(objects, "id");
    found.ready_at = outbox_column(objects, "ready_at");
    found.state = outbox_column(objects, "state");
    found.attempts = outbox_column(objects, "attempts");
    found.max_attempts = outbox_column(objects, "max_attempts");
    found.key_seq = outbox_column(objects, "key_seq");
    found.topic = outbox_column(objects, "topic");
    found.key = outbox_column(objects, "key");
    Oid type = InvalidOid;
    int32 typmod = 0;
    get_atttypetypmodcoll(objects.outbox, found.key, &type, &typmod, &found.key_collation);
    found.pending = outbox_state_value("pending");
    found.in_flight = outbox_state_value("in_flight");
    found.dead = outbox_state_value("dead");
    get_atttypetypmodcoll(objects.outbox, found.topic, &type, &typmod, &found.topic_collation);
    found.ready = outbox_index(objects, OutboxIndex::Ready, found);
    found.ready_all = outbox_index(objects, OutboxIndex::ReadyAll, found);
    found.key_order = outbox_index(objects, OutboxIndex::KeyOrder, found);
    const Datum sequence = DirectFunctionCall2(
        pg_get_serial_sequence,
        CStringGetTextDatum(qualified_table_name(objects.outbox)), CStringGetTextDatum("id"));
    found.id_sequence = DatumGetObjectId(
        DirectFunctionCall1(regclassin, CStringGetDatum(TextDatumGetCString(sequence))));
    found.layout = objects.layout;
    known = found;
    return known;
}

void scan_key(ScanKeyData* out, Relation index, AttrNumber column, StrategyNumber strategy,
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
        scan_key(&out[n++], index, column++, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(k->topic));
    scan_key(&out[n++], index, column, BTGreaterEqualStrategyNumber, F_TIMESTAMPTZ_GE,
        TimestampTzGetDatum(k->from));
    scan_key(&out[n], index, column, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
        TimestampTzGetDatum(k->now));
}

Datum attribute(TupleTableSlot* slot, AttrNumber column, bool* isnull) {
    return slot_getattr(slot, column, isnull);
}

bool is_live(const Layout& l, TupleTableSlot* slot, bool* pending) {
    bool isnull = false;
    const Datum state = attribute(slot, l.state, &isnull);
    *pending = state == l.pending;
    return state == l.pending || state == l.in_flight;
}

// Pending, in flight, or dead: a dead event holds its key's later events
// back until it is redriven or discarded.
bool in_key_order(const Layout& l, TupleTableSlot* slot, bool* pending) {
    bool isnull = false;
    const Datum state = attribute(slot, l.state, &isnull);
    *pending = state == l.pending;
    return state == l.pending || state == l.in_flight || state == l.dead;
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
               std::int64_t* seen_id, TopicFilter* only) {
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
                 if (!attempts_left(attempts,
                                    isnull ? std::nullopt : std::optional<std::int32_t>(DatumGetInt32(cap)),
                                    max_attempts))
                     return true;
             }
             if (only != nullptr) {
                 if (!only->any_due) only->first_due = ready_at;
                 only->any_due = true;
                 if (!topic_set_contains(*only->topics,
                                         DatumGetTextPP(attribute(slot, l.topic, &isnull)))) {
                     only->stopped = ++only->foreign_read > only->foreign_limit;
                     return !only->stopped;
                 }
             }
             ReadyRow& row = out[count++];
             row.id = id;
             row.ready_at = ready_at;
             row.xmax = row_holder(slot);
             ItemPointerCopy(&slot->tts_tid, &row.ctid);
             return count < limit;
         });
    return count;
}

std::int64_t next_event_id() { return nextval_internal(layout().id_sequence, false); }

KeyOrderReader open_key_order() {
    const Layout& l = layout();
    KeyOrderReader reader{};
    reader.heap = table_open(extension_objects().outbox, AccessShareLock);
    reader.index = index_open(l.key_order, AccessShareLock);
    reader.snapshot = RegisterSnapshot(GetLatestSnapshot());
    reader.scan = begin_index_scan(reader.heap, reader.index, reader.snapshot, 3);
    reader.scan->xs_want_itup = true;  // next_live looks at an entry's id before its row
    reader.slot = table_slot_create(reader.heap, nullptr);
    return reader;
}

void close_key_order(KeyOrderReader* reader) {
    ExecDropSingleTupleTableSlot(reader->slot);
    index_endscan(reader->scan);
    UnregisterSnapshot(reader->snapshot);
    index_close(reader->index, AccessShareLock);
    table_close(reader->heap, AccessShareLock);
}

namespace {

// The key-order index's first column: the index expression
// hashtextextended(key, hashtextextended(topic, 0)), computed alike.
std::int64_t key_hash(const text* topic, const text* key) {
    const Layout& l = layout();
    const Datum seed = DirectFunctionCall2Coll(hashtextextended, l.key_collation,
                                               PointerGetDatum(topic), Int64GetDatum(0));
    return DatumGetInt64(
        DirectFunctionCall2Coll(hashtextextended, l.key_collation, PointerGetDatum(key), seed));
}

bool same_text(Datum a, const text* b) { return same_text_bytes(DatumGetTextPP(a), b); }

// Positions the reader on the live events of (topic, key) with
// low <= place <= high.
void key_range(KeyOrderReader* reader, const text* topic, const text* key, std::int64_t low,
               std::int64_t high) {
    ScanKeyData keys[3];
    scan_key(&keys[0], reader->index, 1, BTEqualStrategyNumber, F_INT8EQ,
             Int64GetDatum(key_hash(topic, key)));
    scan_key(&keys[1], reader->index, 2, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(low));
    scan_key(&keys[2], reader->index, 2, BTLessEqualStrategyNumber, F_INT8LE, Int64GetDatum(high));
    index_rescan(reader->scan, keys, 3, nullptr, 0);
    reader->topic = topic;
    reader->key = key;
}

// The id of the index entry the reader's scan is on (the key-order index's
// third column).
std::int64_t entry_id(const KeyOrderReader* reader) {
    bool isnull = false;
    return DatumGetInt64(index_getattr(reader->scan->xs_itup, 3, reader->scan->xs_itupdesc, &isnull));
}

// The next visible live event of the reader's key in `direction` (rows of
// other keys with the same hash are passed over). Entries of the sorted
// `skip` ids are passed over from the index alone: the event an ack just
// ended heads its key's entries, and its row need not be read to know it.
bool next_live(KeyOrderReader* reader, ScanDirection direction, KeyEvent* out,
               const std::int64_t* skip = nullptr, int skip_count = 0) {
    const Layout& l = layout();
    IndexScanDesc scan = reader->scan;
    for (;;) {
        // As index_getnext_slot does, with a look at the entry in between.
        if (!scan->xs_heap_continue) {
            if (index_getnext_tid(scan, direction) == nullptr) return false;
            if (skip_count > 0 && skipped(entry_id(reader), skip, skip_count)) continue;
        }
        if (!index_fetch_heap(scan, reader->slot)) continue;
        bool pending = false;
        if (!in_key_order(l, reader->slot, &pending)) continue;
        bool isnull = false;
        if (!same_text(slot_getattr(reader->slot, l.topic, &isnull), reader->topic)) continue;
        const Datum key = slot_getattr(reader->slot, l.key, &isnull);
        if (isnull || !same_text(key, reader->key)) continue;
        *out = key_event(l, reader->slot, pending);
        return true;
    }
}

// A look back reads a window of places first: a btree scan reads every
// matching entry of the leaf page it starts on, behind a place lie a hot
// key's acked events not yet vacuumed, and the last live event is most
// often close. A look forward reads in one pass: after a place lie the
// key's waiting events, and most keys have none (a second pass would be a
// second descent of the index for nothing).
constexpr std::int64_t kWindow = 8192;

std::int64_t minus(std::int64_t a, std::int64_t b) { return a < PG_INT64_MIN + b ? PG_INT64_MIN : a - b; }

}  // namespace

KeyEvent first_event_from(KeyOrderReader* reader, const text* topic, const text* key,
                          std::int64_t place, const std::int64_t* skip, int skip_count) {
    KeyEvent event{};
    key_range(reader, topic, key, place, PG_INT64_MAX);
    return next_live(reader, ForwardScanDirection, &event, skip, skip_count) ? event : KeyEvent{};
}

int key_events_from(KeyOrderReader* reader, const text* topic, const text* key, std::int64_t place,
                    std::int64_t after_id, std::int64_t upto, KeyEvent* out, int limit) {
    key_range(reader, topic, key, place, upto);
    int count = 0;
    KeyEvent event{};
    while (count < limit && next_live(reader, ForwardScanDirection, &event))
        if (!(event.place == place && event.id <= after_id)) out[count++] = event;
    return count;
}

KeyEvent last_event_before(KeyOrderReader* reader, const text* topic, const text* key,
                           std::int64_t place) {
    KeyEvent event{};
    const std::int64_t near = minus(place, kWindow);
    for (int pass = 0; pass < 2; ++pass) {
        key_range(reader, topic, key, pass == 0 ? near : PG_INT64_MIN,
                  pass == 0 ? minus(place, 1) : minus(near, 1));
        if (next_live(reader, BackwardScanDirection, &event)) return event;
        if (near == PG_INT64_MIN) break;
    }
    return KeyEvent{};
}

}  // namespace idem::pg
