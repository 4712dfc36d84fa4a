#include "pg/outbox/heads.hpp"

#include <algorithm>
#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/arrays.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/owner_scope.hpp"
#include "pg/boundary/text_bytes.hpp"
#include "pg/outbox/index.hpp"
#include "pg/outbox/producer_turn.hpp"
#include "pg/outbox/ready_floor.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

#define OUTBOX " @outbox@ "

// What the heads' changes write; the reads are direct index reads
// (pg/outbox/index.hpp). A new head is pending (due at its
// available_at), or in flight as a follower in its head's run (ready again
// when its lease ends); one acked or dead since the read is no longer any
// key's waiting event. The statements by id are planned once (a generic
// plan: the primary key, whatever the ids): a custom plan would be made
// anew at each ack, and cost more to make than the write it plans.
Statement kMakeHeads = {
    "UPDATE" OUTBOX "SET ready_at = CASE WHEN state = 'in_flight' THEN lease_until "
    "ELSE GREATEST(available_at, $2) END "
    "WHERE id = ANY ($1) AND ready_at IS NULL AND state IN ('pending', 'in_flight') RETURNING id",
    2, {INT8ARRAYOID, TIMESTAMPTZOID}, nullptr, 0, CURSOR_OPT_GENERIC_PLAN};

Statement kUnmakeHeads = {
    "UPDATE" OUTBOX "SET ready_at = NULL WHERE id = ANY ($1) AND ready_at IS NOT NULL "
    "AND state = 'pending'",
    1, {INT8ARRAYOID}, nullptr, 0, CURSOR_OPT_GENERIC_PLAN};

// New places for waiting events.
Statement kPlace = {
    "UPDATE" OUTBOX "o SET key_seq = p.place, ready_at = NULL "
    "FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), "
    "     pg_catalog.unnest($2::pg_catalog.int8[])) AS p(id, place) "
    "WHERE o.id = p.id AND o.state = 'pending'",
    2, {INT8ARRAYOID, INT8ARRAYOID}, nullptr};

// Places after every place taken so far: the outbox's id sequence.
Statement kNewPlaces = {
    "SELECT pg_catalog.nextval(pg_catalog.pg_get_serial_sequence("
    "$1::pg_catalog.regclass::pg_catalog.text, 'id')) FROM pg_catalog.generate_series(1, $2)",
    2, {OIDOID, INT4OID}, nullptr};

// A redriven event as it is now.
Statement kRedrivenNow = {
    "SELECT state = 'pending', ready_at IS NOT NULL, COALESCE(key_seq, id) FROM" OUTBOX
    "WHERE id = $1",
    1, {INT8OID}, nullptr, 0, CURSOR_OPT_GENERIC_PLAN};

Statement kSetRedriven = {
    "UPDATE" OUTBOX "SET ready_at = $2, key_seq = $3 WHERE id = $1 AND state = 'pending'",
    3, {INT8OID, TIMESTAMPTZOID, INT8OID}, nullptr, 0, CURSOR_OPT_GENERIC_PLAN};

// --- what this transaction recorded -------------------------------------------------

enum class Kind : std::uint8_t { Enqueued, Ended, Redriven };

struct Record {
    std::int64_t id;     // Enqueued, Redriven: the event; Ended: the head made at once, or 0
    std::int64_t place;  // Ended: the ended head's place; Redriven: the event's, when redriven
    std::int64_t made_place;  // Ended: the place of the head made at once
    std::int64_t ended_id;    // Ended: the event that ended (0: not known)
    const text* topic;
    const text* key;
    std::uint64_t seen;  // Enqueued: the turn's commit count before the key was looked at
    std::uint32_t turn;
    SubTransactionId made_in;
    Kind kind;
    bool head;   // Enqueued: made its key's head at once
    bool tried;  // Ended: the next head was looked for before the commit step
};

// All in TopTransactionContext, gone with the transaction.
Record* records = nullptr;
int record_count = 0;
int record_capacity = 0;
bool untried = false;     // ended heads whose next head was not looked for yet
Oid writer = InvalidOid;  // the functions' owner does the checks
// The turns taken before the commit: counted once it is visible.
std::uint32_t* taken = nullptr;
int taken_count = 0;

const text* copy_text(const text* value) {
    return reinterpret_cast<const text*>(
        DatumGetPointer(datumCopy(PointerGetDatum(value), false, -1)));
}

// An array of `count` T (and one more, so that none is empty) in the
// current memory context. The arrays a transaction's records size may pass
// the 1 GB that palloc allows at once (the records' own array does past
// about 10 million records, a backfill of keyed events in one
// transaction): they are huge allocations, bounded by memory alone.
template <typename T>
T* array_of(std::size_t count, int flags = 0) {
    return static_cast<T*>(palloc_extended(sizeof(T) * (count + 1), MCXT_ALLOC_HUGE | flags));
}

void add(Kind kind, const text* topic, const text* key, std::int64_t id, std::int64_t place,
         bool head, std::uint64_t seen = kNoCount) {
    MemoryContext const old = MemoryContextSwitchTo(TopTransactionContext);
    if (record_count == record_capacity) {
        // By half again, not double: a huge transaction's array is then at
        // most a third larger than its records.
        record_capacity = record_capacity == 0 ? 16 : record_capacity + record_capacity / 2;
        records = records == nullptr
                      ? array_of<Record>(record_capacity)
                      : static_cast<Record*>(repalloc_huge(
                            records, sizeof(Record) * (std::size_t(record_capacity) + 1)));
    }
    // Consecutive records of one topic, or one key (a bulk enqueue), share
    // the copies.
    const Record* last = record_count > 0 ? &records[record_count - 1] : nullptr;
    const bool same_topic = last != nullptr && compare_text_bytes(last->topic, topic) == 0;
    const bool same = same_topic && compare_text_bytes(last->key, key) == 0;
    records[record_count++] =
        Record{id,
               place,
               0,
               0,
               same_topic ? last->topic : copy_text(topic),
               same ? last->key : copy_text(key),
               seen,
               same ? last->turn : producer_turn_of(topic, key),
               GetCurrentSubTransactionId(),
               kind,
               head,
               false};
    MemoryContextSwitchTo(old);
    writer = GetUserId();
}

void forget_all() {
    records = nullptr;
    record_count = record_capacity = 0;
    untried = false;
    writer = InvalidOid;
    taken = nullptr;
    taken_count = 0;
}

bool same_key(const Record& a, const Record& b) {
    return compare_text_bytes(a.topic, b.topic) == 0 && compare_text_bytes(a.key, b.key) == 0;
}

// Records in turn, then (topic, key), then kind and id order.
bool record_before(const Record& a, const Record& b) {
    if (a.turn != b.turn) return a.turn < b.turn;
    if (const int c = compare_text_bytes(a.topic, b.topic)) return c < 0;
    if (const int c = compare_text_bytes(a.key, b.key)) return c < 0;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.id < b.id;
}

void take_turns() {
    MemoryContext const old = MemoryContextSwitchTo(TopTransactionContext);
    taken = array_of<std::uint32_t>(record_count);
    MemoryContextSwitchTo(old);
    taken_count = 0;
    std::uint32_t last = kProducerTurns;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].turn == last) continue;
        last = records[i].turn;
        take_producer_turn(last);
        taken[taken_count++] = last;
    }
}

// --- the checks ----------------------------------------------------------------

Datum int8_array_of(const std::int64_t* values, int count) {
    Datum* datums = array_of<Datum>(count);
    for (int i = 0; i < count; ++i) datums[i] = Int64GetDatum(values[i]);
    return int8_array(datums, count);
}

// A list of ids (and places) to write, in the current memory context.
struct IdList {
    std::int64_t* ids;
    std::int64_t* places;
    int count;
    int capacity;
};

IdList id_list(int capacity) {
    return IdList{array_of<std::int64_t>(capacity), array_of<std::int64_t>(capacity), 0, capacity};
}

// Adds to a list whose length is not known beforehand.
void push(IdList* list, std::int64_t id, std::int64_t place) {
    if (list->count == list->capacity) {
        list->capacity = std::max(16, list->capacity * 2);
        const std::size_t bytes = sizeof(std::int64_t) * (std::size_t(list->capacity) + 1);
        list->ids = static_cast<std::int64_t*>(repalloc_huge(list->ids, bytes));
        list->places = static_cast<std::int64_t*>(repalloc_huge(list->places, bytes));
    }
    list->ids[list->count] = id;
    list->places[list->count++] = place;
}

// Makes the pending events of `list` heads; returns how many it made (their
// ids in *made when given). `latest`: with the newest committed data (the
// checks before the commit), else as the statement sees it.
int make_heads(const IdList& list, Micros now, bool latest, std::int64_t* made = nullptr) {
    if (list.count == 0) return 0;
    Params params;
    params.add(int8_array_of(list.ids, list.count)).add_timestamp(now);
    const std::uint64_t rows =
        latest ? execute_latest(kMakeHeads, params) : execute(kMakeHeads, params);
    if (rows > 0) note_ready_written(now);
    if (made != nullptr)
        for (std::uint64_t row = 0; row < rows; ++row) made[row] = *column_int8(1, row);
    return static_cast<int>(rows);
}

void unmake_heads(const IdList& list) {
    if (list.count == 0) return;
    Params params;
    params.add(int8_array_of(list.ids, list.count));
    execute_latest(kUnmakeHeads, params);
}

void place(const IdList& list) {
    if (list.count == 0) return;
    Params params;
    params.add(int8_array_of(list.ids, list.count)).add(int8_array_of(list.places, list.count));
    execute_latest(kPlace, params);
}

// After ended heads, under the turns. Where the head made at once still
// holds, live events between the ended head's place and it (a redriven
// event that waited behind the ended head) move to its place, next after
// it; where none was made or it no longer holds, the key's first live event
// from that place becomes the head.
void check_ended(const int* which, int count, Micros now) {
    constexpr int kLook = 16;
    KeyEvent events[kLook];
    IdList heads = id_list(count);
    IdList moves = id_list(0);
    KeyOrderReader reader = open_key_order();
    for (int i = 0; i < count; ++i) {
        const Record& r = records[which[i]];
        bool made_holds = false;
        const int moves_before = moves.count;
        if (r.id != 0) {
            // The events from the ended head's place up to the head made.
            std::int64_t from = r.place;
            std::int64_t after = 0;
            for (bool more = true; more && !made_holds;) {
                const int n = key_events_from(&reader, r.topic, r.key, from, after, r.made_place,
                                              events, kLook);
                more = n == kLook;
                for (int e = 0; e < n; ++e) {
                    if (events[e].id == r.id) {
                        made_holds = events[e].ready;
                        more = false;
                        break;
                    }
                    if (events[e].place > r.made_place) {  // gone from the key's live events
                        more = false;
                        break;
                    }
                    if (events[e].place != r.made_place) push(&moves, events[e].id, r.made_place);
                    from = events[e].place;
                    after = events[e].id;
                }
            }
        }
        if (made_holds) continue;
        moves.count = moves_before;
        const KeyEvent first = first_event_from(&reader, r.topic, r.key, r.place, &r.ended_id,
                                                r.ended_id != 0 ? 1 : 0);
        if (first.found && !first.ready) heads.ids[heads.count++] = first.id;
    }
    close_key_order(&reader);
    place(moves);
    make_heads(heads, now, true);
}

// A redriven event waits behind the head its key has (next after it), or
// becomes the head when its key has none. The head is looked for from
// `from`, the lowest place of the key's events this transaction redrove:
// every live event of the key is there or later (they died as heads).
void check_redriven(const Record& r, std::int64_t from, bool latest, Micros now) {
    Params params;
    params.add_int8(r.id);
    const std::uint64_t rows =
        latest ? execute_latest(kRedrivenNow, params) : execute(kRedrivenNow, params);
    if (rows == 0) return;
    bool isnull = false;
    if (!DatumGetBool(column(1, &isnull))) return;  // handed out, acked or dead again since
    const bool is_head = DatumGetBool(column(2, &isnull));
    const std::int64_t own_place = DatumGetInt64(column(3, &isnull));
    constexpr int kLook = 64;
    KeyEvent events[kLook];
    bool other_head = false;
    std::int64_t head_place = 0;
    std::int64_t at = from;
    std::int64_t after = 0;
    KeyOrderReader reader = open_key_order();
    for (bool more = true; more && !other_head;) {
        const int n = key_events_from(&reader, r.topic, r.key, at, after, PG_INT64_MAX, events, kLook);
        more = n == kLook;
        for (int e = 0; e < n && !other_head; ++e) {
            if (events[e].id != r.id && events[e].ready) {
                other_head = true;
                head_place = events[e].place;
            }
            at = events[e].place;
            after = events[e].id;
        }
    }
    close_key_order(&reader);
    Params set;
    set.add_int8(r.id);
    if (other_head) {
        if (!is_head && own_place == head_place) return;
        set.add_null().add_int8(head_place);
    } else {
        if (is_head) return;
        set.add_timestamp(now).add_int8(own_place);
        note_ready_written(now);
    }
    if (latest)
        execute_latest(kSetRedriven, set);
    else
        execute(kSetRedriven, set);
}

// The enqueued events of one key: records [from, to), in id order; alone:
// the transaction did nothing else to the key.
struct KeyGroup {
    int from;
    int to;
    bool alone;
};

// This transaction's events of each key, under the turns: another
// transaction's live event of the key with a later place committed first,
// so this transaction's events go after it, in order; else, one with an
// earlier place means the key has its head; else this transaction's first
// event of the key is the head.
void check_enqueued(const KeyGroup* groups, int count, Micros now) {
    int events = 0;
    for (int g = 0; g < count; ++g) events += groups[g].to - groups[g].from;
    auto* ids = array_of<std::int64_t>(events);
    for (int i = 0, n = 0; i < count; ++i)
        for (int r = groups[i].from; r < groups[i].to; ++r) ids[n++] = records[r].id;
    IdList heads = id_list(count);
    IdList unmade = id_list(events);
    auto* later = array_of<bool>(count, MCXT_ALLOC_ZERO);
    int to_place = 0;
    // Opened for the first key that needs a look: none does when nothing
    // committed on their turns since the enqueues looked.
    KeyOrderReader reader{};
    bool reading = false;
    for (int g = 0, offset = 0; g < count; offset += groups[g].to - groups[g].from, ++g) {
        const KeyGroup& group = groups[g];
        const Record& first = records[group.from];
        const int mine = group.to - group.from;
        // Nothing committed on the key's turn since it was looked at: what
        // the enqueue decided holds.
        if (group.alone && turn_unchanged(first.turn, first.seen)) continue;
        if (!reading) {
            reader = open_key_order();
            reading = true;
        }
        later[g] =
            first_event_from(&reader, first.topic, first.key, first.id + 1, ids + offset, mine).found;
        if (later[g]) {
            to_place += mine;
            continue;
        }
        const bool earlier = last_event_before(&reader, first.topic, first.key, first.id).found;
        for (int i = group.from; i < group.to; ++i) {
            const bool should_head = !earlier && i == group.from;
            if (records[i].head && !should_head) unmade.ids[unmade.count++] = records[i].id;
            if (!records[i].head && should_head) heads.ids[heads.count++] = records[i].id;
        }
    }
    if (reading) close_key_order(&reader);
    unmake_heads(unmade);
    make_heads(heads, now, true);
    if (to_place == 0) return;
    Params next;
    next.add(ObjectIdGetDatum(extension_objects().outbox)).add_int4(to_place);
    execute(kNewPlaces, next);
    IdList placed = id_list(to_place);
    for (int g = 0; g < count; ++g) {
        if (!later[g]) continue;
        for (int i = groups[g].from; i < groups[g].to; ++i) {
            placed.places[placed.count] = *column_int8(1, placed.count);
            placed.ids[placed.count++] = records[i].id;
        }
    }
    place(placed);
}

void check_all() {
    std::sort(records, records + record_count, record_before);
    take_turns();
    const Micros now = GetCurrentTimestamp();
    int* ended = array_of<int>(record_count);
    auto* groups = array_of<KeyGroup>(record_count);
    int ended_count = 0;
    int group_count = 0;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].kind == Kind::Ended) ended[ended_count++] = i;
        if (records[i].kind != Kind::Enqueued) continue;
        if (group_count > 0 && same_key(records[groups[group_count - 1].from], records[i]))
            groups[group_count - 1].to = i + 1;
        else
            groups[group_count++] = KeyGroup{i, i + 1, true};
    }
    // Records of one key are adjacent, enqueued ones first.
    for (int g = 0; g < group_count; ++g) {
        const int next = groups[g].to;
        if (next < record_count && same_key(records[next], records[groups[g].from]))
            groups[g].alone = false;
    }
    // Ended heads first (their successors), then redriven events (behind
    // whatever head that left), then this transaction's own events.
    if (ended_count > 0) check_ended(ended, ended_count, now);
    std::int64_t from = 0;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].kind != Kind::Redriven) continue;
        const bool first_of_key = i == 0 || records[i - 1].kind != Kind::Redriven ||
                                  !same_key(records[i - 1], records[i]);
        if (first_of_key) {
            from = records[i].place;
            for (int j = i + 1; j < record_count && records[j].kind == Kind::Redriven &&
                                same_key(records[j], records[i]);
                 ++j)
                from = std::min(from, records[j].place);
        }
        check_redriven(records[i], from, true, now);
    }
    if (group_count > 0) check_enqueued(groups, group_count, now);
}

void before_commit() {
    if (record_count == 0 || find_extension_objects() == nullptr) return;
    const OwnerScope scope = enter_owner_scope_of(writer);
    PushActiveSnapshot(GetTransactionSnapshot());
    connect_spi();
    check_all();
    finish_spi();
    fire_triggers_deferred_to_commit();
    PopActiveSnapshot();
    leave_owner_scope(scope);
}

void on_transaction_event(XactEvent event, void*) {
    if (records == nullptr) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
        before_commit();
        record_count = 0;
        break;
    case XACT_EVENT_PRE_PREPARE:
        before_commit();
        record_count = 0;
        // COMMIT PREPARED may run anywhere: the turns stay marked.
        turns_prepared(taken, taken_count);
        break;
    case XACT_EVENT_COMMIT:
        // Visible now, and the turns are still held.
        turns_committed(taken, taken_count);
        forget_all();
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
        forget_all();
        break;
    default:
        break;
    }
}

// A rolled-back subtransaction takes its records back; a committed one
// hands them to its parent. Its records are the last ones: each was added
// since it began, and its own subtransactions' records were handed to it
// or taken back as they ended. So a loop of savepoints that each enqueue
// costs each end its own records, not every record before it.
void on_subtransaction_event(SubXactEvent event, SubTransactionId mine, SubTransactionId parent,
                             void*) {
    if (records == nullptr) return;
    if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) return;
    int first = record_count;
    while (first > 0 && records[first - 1].made_in == mine) --first;
    if (event == SUBXACT_EVENT_ABORT_SUB) {
        record_count = first;
        return;
    }
    for (int i = first; i < record_count; ++i) records[i].made_in = parent;
}

}  // namespace

void enqueued_keyed(const text* topic, const text* key, std::int64_t id, bool head,
                    std::uint64_t seen) {
    add(Kind::Enqueued, topic, key, id, 0, head, seen);
}

void heads_ended(const EndedHeads& ended, Micros) {
    for (int i = 0; i < ended.count; ++i) {
        add(Kind::Ended, ended.topics[i], ended.keys[i], 0, ended.places[i], false);
        records[record_count - 1].ended_id = ended.ids[i];
    }
    untried |= ended.count > 0;
}

void promote_ended_heads(Micros now) {
    if (!untried) return;
    untried = false;
    // The next live event of each key from the ended head's place (a
    // redriven event waiting in that place comes first) becomes its head.
    IdList next = id_list(record_count);
    auto* next_place = array_of<std::int64_t>(record_count);
    auto* of = array_of<int>(record_count);
    KeyOrderReader reader = open_key_order();
    for (int i = 0; i < record_count; ++i) {
        Record& r = records[i];
        if (r.kind != Kind::Ended || r.tried) continue;
        r.tried = true;
        const KeyEvent event = first_event_from(&reader, r.topic, r.key, r.place, &r.ended_id,
                                                r.ended_id != 0 ? 1 : 0);
        if (!event.found || event.ready) continue;
        next_place[next.count] = event.place;
        of[next.count] = i;
        next.ids[next.count++] = event.id;
    }
    close_key_order(&reader);
    auto* made = array_of<std::int64_t>(next.count);
    const int made_count = make_heads(next, now, false, made);
    // Each head made is recorded with its ended head.
    for (int n = 0; n < next.count; ++n) {
        bool was_made = false;
        for (int m = 0; m < made_count && !was_made; ++m) was_made = made[m] == next.ids[n];
        if (!was_made) continue;
        records[of[n]].id = next.ids[n];
        records[of[n]].made_place = next_place[n];
    }
}

void redriven_keyed(std::int64_t id, const text* topic, const text* key, std::int64_t place,
                    Micros now) {
    add(Kind::Redriven, topic, key, id, place, false);
    const Record& added = records[record_count - 1];
    std::int64_t from = place;
    for (int i = 0; i < record_count - 1; ++i)
        if (records[i].kind == Kind::Redriven && same_key(records[i], added))
            from = std::min(from, records[i].place);
    check_redriven(added, from, false, now);
}

EndedHeads ended_heads_in_result(int first) {
    const std::uint64_t rows = SPI_processed;
    EndedHeads out{array_of<const text*>(rows), array_of<const text*>(rows),
                   array_of<std::int64_t>(rows), array_of<std::int64_t>(rows, MCXT_ALLOC_ZERO), 0};
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool no_key = false;
        const Datum key = column(first + 1, &no_key, row);
        if (no_key) continue;
        bool isnull = false;
        // Copied out of SPI's memory: the caller's context outlives the next statement.
        out.topics[out.count] = reinterpret_cast<const text*>(DatumGetPointer(
            datumCopy(column(first, &isnull, row), false, -1)));
        out.keys[out.count] =
            reinterpret_cast<const text*>(DatumGetPointer(datumCopy(key, false, -1)));
        out.places[out.count++] = DatumGetInt64(column(first + 2, &isnull, row));
    }
    return out;
}

void install_outbox_heads_callbacks() {
    register_guarded_callback(on_transaction_event);
    register_guarded_callback(on_subtransaction_event);
}

}  // namespace idem::pg
