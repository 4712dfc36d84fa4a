#include "pg/outbox/rows.hpp"

#include <algorithm>

#include "core/retry.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/index.hpp"
#include "pg/outbox/layout.hpp"

namespace idem::pg {

namespace {

// The columns a change sets, as an UPDATE's SET list names them.
struct Setting {
    AttrNumber columns[16];
    int count;
};

void put(TupleTableSlot* row, Setting* setting, AttrNumber column, Datum value) {
    set_column(row, column, value);
    if (column != 0) setting->columns[setting->count++] = column;
}

void clear(TupleTableSlot* row, Setting* setting, AttrNumber column) {
    set_null(row, column);
    if (column != 0) setting->columns[setting->count++] = column;
}

// Whether the column has a value in `row` (not NULL, and installed).
bool has_value(TupleTableSlot* row, AttrNumber column, Datum* value) {
    if (column == 0) return false;
    bool isnull = false;
    *value = slot_getattr(row, column, &isnull);
    return !isnull;
}

std::int32_t attempts_of(TupleTableSlot* row, const OutboxColumns& at) {
    Datum attempts = 0;
    return has_value(row, at.attempts, &attempts) ? DatumGetInt32(attempts) : 0;
}

bool state_is(TupleTableSlot* row, const OutboxColumns& at, Datum state) {
    Datum value = 0;
    return has_value(row, at.state, &value) && value == state;
}

const text* copied_text(Datum value) {
    return reinterpret_cast<const text*>(DatumGetPointer(datumCopy(value, false, -1)));
}

// Records what RETURNING topic, key, COALESCE(key_seq, id) gives of a
// changed row (ready-queue layout): its topic, and the head it ended when
// it has a key and was its key's head (`was_head`: it had a ready_at; a
// follower in a run acked with its head ends nothing of its own).
void note_changed(TupleTableSlot* row, const OutboxColumns& at, bool was_head, ChangedEvents* out) {
    ++out->count;
    Datum topic = 0;
    if (at.ready_at == 0 || !has_value(row, at.topic, &topic)) return;
    const text* topic_copy = copied_text(topic);
    out->topics[out->topic_count++] = topic_copy;
    Datum key = 0;
    if (!was_head || !has_value(row, at.key, &key)) return;
    Datum place = 0;
    if (!has_value(row, at.key_seq, &place)) (void)has_value(row, at.id, &place);
    EndedHeads& ended = out->ended;
    ended.topics[ended.count] = topic_copy;
    ended.keys[ended.count] = copied_text(key);
    Datum id = 0;
    ended.ids[ended.count] = has_value(row, at.id, &id) ? DatumGetInt64(id) : 0;
    ended.places[ended.count++] = DatumGetInt64(place);
}

ChangedEvents no_changes(int count) {
    const auto texts = [count] {
        return static_cast<const text**>(palloc(sizeof(text*) * (count + 1)));
    };
    const auto numbers = [count] {
        return static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (count + 1)));
    };
    EndedHeads ended{texts(), texts(), numbers(), numbers(), 0};
    return ChangedEvents{0, ended, texts(), 0};
}

// The positions of `ids` in id order, each id once (as an index scan of
// id = ANY reads them): of `count`, returns how many.
int in_id_order(const Datum* ids, int count, int* order) {
    for (int i = 0; i < count; ++i) order[i] = i;
    std::sort(order, order + count, [ids](int a, int b) {
        return DatumGetInt64(ids[a]) < DatumGetInt64(ids[b]);
    });
    int kept = 0;
    for (int i = 0; i < count; ++i)
        if (kept == 0 || DatumGetInt64(ids[order[kept - 1]]) != DatumGetInt64(ids[order[i]]))
            order[kept++] = order[i];
    return kept;
}

// Whether the row version `version` (a version this transaction locked) is
// what the statement's snapshot sees of event `id`: then it is the row
// found, without a look in the primary key.
bool find_known_version(OpenTable* table, const ItemPointerData* version, Datum id,
                        const OutboxColumns& at) {
    if (version == nullptr || !ItemPointerIsValid(version)) return false;
    if (!find_row_version(table, version, RowLock::None, false)) return false;
    Datum found_id = 0;
    return has_value(table->found, at.id, &found_id) && DatumGetInt64(found_id) == DatumGetInt64(id);
}

// Changes the events of `ids` in one UPDATE: `applies(found, at)` is its
// WHERE clause beyond the id, `write(i, row, at, setting)` its SET list for
// the event ids[i]; each row changed goes to note_changed. `versions`, when
// given, are row versions to try first (one per id).
template <typename Applies, typename Write>
ChangedEvents change_events(const Datum* ids, const ItemPointerData* versions, int count,
                            Applies applies, Write write) {
    ChangedEvents changed = no_changes(count);
    int* order = static_cast<int*>(palloc(sizeof(int) * (count + 1)));
    const int events = in_id_order(ids, count, order);
    OpenTable table = open_to_write(extension_objects().outbox);
    const OutboxColumns& at = outbox_columns(table.heap);
    // One statement, whatever it finds: its triggers fire once, and every
    // find reads with its snapshot.
    begin_statement(&table, CMD_UPDATE);
    for (int n = 0; n < events; ++n) {
        const int i = order[n];
        if (!find_known_version(&table, versions != nullptr ? &versions[i] : nullptr, ids[i], at) &&
            !find_row(&table, &ids[i], RowLock::None, false))
            continue;
        for (;;) {
            if (!applies(table.found, at)) break;
            Datum ready_at = 0;
            const bool was_head = has_value(table.found, at.ready_at, &ready_at);
            TupleTableSlot* row = changed_row(&table);
            Setting setting{};
            write(i, row, at, &setting);
            const Change change = update_found_row(&table, row, setting.columns, setting.count);
            if (change == Change::Done) note_changed(row, at, was_head, &changed);
            if (change != Change::Again) break;
        }
    }
    close_table(&table);
    return changed;
}

// Whether the event in `row` has attempts left under its cap (`max_attempts`
// when it recorded none).
bool has_attempts_left(TupleTableSlot* row, const OutboxColumns& at, int max_attempts) {
    Datum cap = 0;
    return attempts_left(attempts_of(row, at),
                         has_value(row, at.max_attempts, &cap)
                             ? std::optional<std::int32_t>(DatumGetInt32(cap))
                             : std::nullopt,
                         max_attempts);
}

// Whether the event in `row` is ready and due at `now`: pending, or in
// flight with attempts left.
bool ready_and_due(TupleTableSlot* row, const OutboxColumns& at, Micros now, int max_attempts) {
    Datum ready_at = 0;
    if (!has_value(row, at.ready_at, &ready_at) || DatumGetTimestampTz(ready_at) > now)
        return false;
    if (state_is(row, at, at.pending)) return true;
    return state_is(row, at, at.in_flight) && has_attempts_left(row, at, max_attempts);
}

// The event's outbox_delivery columns: id, topic, key, payload, headers,
// dedup_key, the attempt it is handed out for, enqueued_at.
HandedOutEvent delivery_of(TupleTableSlot* row, const OutboxColumns& at) {
    HandedOutEvent event;
    const AttrNumber columns[HandedOutEvent::kColumns] = {
        at.id, at.topic, at.key, at.payload, at.headers, at.dedup_key, at.attempts, at.enqueued_at};
    for (int i = 0; i < HandedOutEvent::kColumns; ++i)
        event.values[i] = slot_getattr(row, columns[i], &event.nulls[i]);
    event.values[6] = Int32GetDatum(attempts_of(row, at) + 1);
    event.nulls[6] = false;
    event.lease_ran_out = state_is(row, at, at.in_flight);
    return event;
}

}  // namespace

namespace {

// Whether `row`, found behind a head handed out in this claim, may follow
// it in its run: waiting (no ready_at), and pending past its available_at
// (a retry's backoff, a deliver_at), or in flight with a lease that ran out
// and attempts left (a run whose relay stopped, not yet swept).
bool may_follow(TupleTableSlot* row, const OutboxColumns& at, Micros now, int max_attempts) {
    Datum value = 0;
    if (has_value(row, at.ready_at, &value)) return false;
    if (state_is(row, at, at.pending))
        return has_value(row, at.available_at, &value) && DatumGetTimestampTz(value) <= now;
    if (!state_is(row, at, at.in_flight)) return false;
    if (!has_value(row, at.lease_until, &value) || DatumGetTimestampTz(value) > now) return false;
    return has_attempts_left(row, at, max_attempts);
}

// The key and place of the head in table->found, copied (its slot is read
// again for each follower); false for an event without a key.
bool run_head_of(TupleTableSlot* row, const OutboxColumns& at, RunHead* head) {
    Datum topic = 0, key = 0, place = 0, id = 0;
    if (at.key_seq == 0 || !has_value(row, at.key, &key)) return false;
    (void)has_value(row, at.topic, &topic);
    (void)has_value(row, at.id, &id);
    if (!has_value(row, at.key_seq, &place)) place = id;
    *head = RunHead{copied_text(topic), copied_text(key), DatumGetInt64(place), DatumGetInt64(id)};
    return true;
}

// Hands out, after `head`, up to `room` events of its run (see lock_runs):
// the live events of its key from its place on, in key order (every other
// live event of a key with a head is there), until one may not follow.
// Returns how many, recorded in `out` from `handed` on.
int hand_out_run(OpenTable* table, const OutboxColumns& at, KeyOrderReader* reader,
                 const RunHead& head, int room, Micros now, int max_attempts, HandedOut take,
                 void* context, const LockedEvents& out, int handed) {
    auto* events = static_cast<KeyEvent*>(palloc(sizeof(KeyEvent) * (room + 2)));
    const int found = key_events_from(reader, head.topic, head.key, head.place, -1, PG_INT64_MAX,
                                      events, room + 1);
    int taken = 0;
    for (int e = 0; e < found && taken < room; ++e) {
        if (events[e].id == head.id) continue;
        if (events[e].ready || holds(events[e].id)) break;
        const Datum id = Int64GetDatum(events[e].id);
        // One statement's step: the first find starts it, the others read with it.
        if (!find_row(table, &id, RowLock::ForUpdateIfFree, false)) break;
        if (!may_follow(table->found, at, now, max_attempts)) break;
        take(delivery_of(table->found, at), context);
        ItemPointerCopy(&table->found->tts_tid, &out.versions[handed + taken]);
        out.ids[handed + taken] = events[e].id;
        out.followers[handed + taken] = true;
        ++taken;
    }
    pfree(events);
    return taken;
}

}  // namespace

int lock_due_events(const ItemPointerData* tids, int count, int wanted, Micros now,
                    int max_attempts, HandedOut take, void* context, const LockedEvents& out,
                    RunHead* heads, int* head_count) {
    OpenTable table = open_to_lock(extension_objects().outbox);
    const OutboxColumns& at = outbox_columns(table.heap);
    int handed = 0;
    // One statement: every version is read with its snapshot.
    for (int i = 0; i < count && handed < wanted; ++i) {
        if (!find_row_version(&table, &tids[i], RowLock::ForUpdateIfFree, i == 0)) continue;
        if (!ready_and_due(table.found, at, now, max_attempts)) continue;
        const HandedOutEvent event = delivery_of(table.found, at);
        take(event, context);
        ItemPointerCopy(&table.found->tts_tid, &out.versions[handed]);
        out.ids[handed] = DatumGetInt64(event.values[0]);
        out.followers[handed++] = false;
        if (heads != nullptr && run_head_of(table.found, at, &heads[*head_count])) ++*head_count;
    }
    close_table(&table);
    return handed;
}

int lock_runs(const RunHead* heads, int head_count, int room, int run_length, Micros now,
              int max_attempts, HandedOut take, void* context, const LockedEvents& out) {
    OpenTable table = open_to_lock(extension_objects().outbox);
    const OutboxColumns& at = outbox_columns(table.heap);
    KeyOrderReader reader = open_key_order();
    int handed = 0;
    for (int h = 0; h < head_count && handed < room; ++h)
        handed += hand_out_run(&table, at, &reader, heads[h],
                               std::min(run_length - 1, room - handed), now, max_attempts, take,
                               context, out, handed);
    close_key_order(&reader);
    close_table(&table);
    return handed;
}

InsertedEvent insert_new_event(const NewEvent& event, Micros now, std::int64_t id, bool head) {
    OpenTable table = open_to_write(extension_objects().outbox);
    const OutboxColumns& at = outbox_columns(table.heap);
    TupleTableSlot* row = new_row(&table);
    set_column(row, at.id, Int64GetDatum(id));
    set_column(row, at.topic, PointerGetDatum(event.topic));
    if (event.key != nullptr) set_column(row, at.key, PointerGetDatum(event.key));
    set_column(row, at.payload, event.payload);
    if (event.has_headers) set_column(row, at.headers, event.headers);
    set_column(row, at.enqueued_at, TimestampTzGetDatum(now));
    set_column(row, at.available_at, TimestampTzGetDatum(event.available_at));
    set_column(row, at.updated_at, TimestampTzGetDatum(now));
    if (head) set_column(row, at.ready_at, TimestampTzGetDatum(std::max(event.available_at, now)));
    insert_row(&table, row);
    // What RETURNING id, ready_at IS NOT NULL reads: the row inserted.
    bool isnull = false;
    const std::int64_t inserted_id = DatumGetInt64(slot_getattr(row, at.id, &isnull));
    (void)slot_getattr(row, at.ready_at, &isnull);
    const InsertedEvent inserted{inserted_id, !isnull};
    close_table(&table);
    return inserted;
}

ChangedEvents ack_by_id(const Datum* ids, const HeldClaims& held, const ItemPointerData* versions,
                        int count, Micros now) {
    const Datum stamp = TimestampTzGetDatum(now);
    const Datum* relays = held.relays;
    const Datum* caps = held.caps;
    return change_events(
        ids, versions, count,
        [relays](TupleTableSlot* found, const OutboxColumns& at) {
            if (relays != nullptr)
                return state_is(found, at, at.pending) || state_is(found, at, at.in_flight);
            return state_is(found, at, at.in_flight) ||
                   (state_is(found, at, at.pending) && attempts_of(found, at) > 0);
        },
        [relays, caps, stamp](int i, TupleTableSlot* row, const OutboxColumns& at, Setting* setting) {
            put(row, setting, at.state, at.delivered);
            if (relays != nullptr) {
                put(row, setting, at.attempts, Int32GetDatum(attempts_of(row, at) + 1));
                put(row, setting, at.relay, relays[i]);
                put(row, setting, at.max_attempts, caps[i]);
            }
            put(row, setting, at.delivered_at, stamp);
            clear(row, setting, at.lease_until);
            put(row, setting, at.updated_at, stamp);
            clear(row, setting, at.ready_at);
        });
}

void write_claims_by_id(const Datum* ids, const Datum* lease_untils, const Datum* relays,
                        const Datum* claimed_ats, const Datum* max_attempts, const bool* followers,
                        int count) {
    (void)change_events(
        ids, nullptr, count,
        [](TupleTableSlot* found, const OutboxColumns& at) {
            return state_is(found, at, at.pending) || state_is(found, at, at.in_flight);
        },
        [&](int i, TupleTableSlot* row, const OutboxColumns& at, Setting* setting) {
            put(row, setting, at.state, at.in_flight);
            put(row, setting, at.attempts, Int32GetDatum(attempts_of(row, at) + 1));
            put(row, setting, at.lease_until, lease_untils[i]);
            put(row, setting, at.relay, relays[i]);
            put(row, setting, at.updated_at, claimed_ats[i]);
            put(row, setting, at.max_attempts, max_attempts[i]);
            Datum ready_at = 0;
            if (followers == nullptr || !followers[i] || has_value(row, at.ready_at, &ready_at))
                put(row, setting, at.ready_at, lease_untils[i]);
        });
}

}  // namespace idem::pg
