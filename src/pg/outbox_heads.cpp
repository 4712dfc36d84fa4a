#include "pg/outbox_heads.hpp"

#include <algorithm>
#include <cstring>

#include "pg/arrays.hpp"
#include "pg/extension_objects.hpp"
#include "pg/guard.hpp"
#include "pg/outbox_ready_floor.hpp"
#include "pg/owner_scope.hpp"
#include "pg/producer_turn.hpp"
#include "pg/spi.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

#define OUTBOX " @outbox@ "
#define LIVE " IN ('pending', 'in_flight') "
#define PLACE(t) " COALESCE(" t ".key_seq, " t ".id) "

// The next event of each key at or after the ended head's place (a
// redriven event waiting in the head's place comes first) becomes the head.
// Returns the ordinal of the key and the new head.
Statement kPromoteNext = {
    "UPDATE" OUTBOX "o SET ready_at = GREATEST(o.available_at, $4) "
    "FROM (SELECT t.i, (SELECT s.id FROM" OUTBOX "s WHERE s.topic = t.topic AND s.key = t.key "
    "        AND s.state" LIVE "AND" PLACE("s") ">= t.place "
    "      ORDER BY" PLACE("s") ", s.id LIMIT 1) AS next "
    "      FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), "
    "           pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int8[])) "
    "           WITH ORDINALITY AS t(topic, key, place, i)) n "
    "WHERE o.id = n.next AND o.ready_at IS NULL RETURNING n.i::pg_catalog.int4, o.id",
    4, {TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID}, nullptr};

// After ended heads, under the turns: whether the head made at once still
// holds, the live events between the ended head's place and it (they must
// move to its place), and else the key's first live event from that place.
Statement kCheckEnded = {
    "SELECT t.i::pg_catalog.int4, "
    "       s.id IS NOT NULL AND s.state" LIVE "AND s.ready_at IS NOT NULL, " PLACE("s") ", "
    "       ARRAY(SELECT g.id FROM" OUTBOX "g WHERE g.topic = t.topic AND g.key = t.key "
    "               AND g.state" LIVE "AND" PLACE("g") ">= t.place AND" PLACE("g") "<" PLACE("s")
    "             ORDER BY" PLACE("g") ", g.id), "
    "       f.id, f.ready_at IS NOT NULL "
    "  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), "
    "       pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int8[]), "
    "       pg_catalog.unnest($4::pg_catalog.int8[])) WITH ORDINALITY AS t(topic, key, place, made, i) "
    "  LEFT JOIN" OUTBOX "s ON s.id = t.made "
    "  LEFT JOIN LATERAL (SELECT f.id, f.ready_at FROM" OUTBOX "f WHERE f.topic = t.topic "
    "       AND f.key = t.key AND f.state" LIVE "AND" PLACE("f") ">= t.place "
    "       ORDER BY" PLACE("f") ", f.id LIMIT 1) f ON true "
    " ORDER BY t.i",
    4, {TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, INT8ARRAYOID}, nullptr};

// Under the turns, for each key this transaction enqueued for (from its
// first event `first` on): whether another transaction's live event of the
// key has a later place (it committed first), and whether one has an
// earlier place (the key has a head already).
Statement kCheckEnqueued = {
    "WITH mine AS MATERIALIZED (SELECT pg_catalog.unnest($1::pg_catalog.int8[]) AS id) "
    "SELECT t.i::pg_catalog.int4, "
    "  EXISTS (SELECT 1 FROM" OUTBOX "o WHERE o.topic = t.topic AND o.key = t.key "
    "          AND o.state" LIVE "AND" PLACE("o") "> t.first "
    "          AND o.id NOT IN (SELECT m.id FROM mine m)), "
    "  (SELECT o.id FROM" OUTBOX "o WHERE o.topic = t.topic AND o.key = t.key "
    "          AND o.state" LIVE "AND" PLACE("o") "< t.first "
    "   ORDER BY" PLACE("o") "DESC, o.id DESC LIMIT 1) IS NOT NULL "
    "  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), "
    "       pg_catalog.unnest($3::pg_catalog.text[]), pg_catalog.unnest($4::pg_catalog.int8[])) "
    "       WITH ORDINALITY AS t(topic, key, first, i) "
    " ORDER BY t.i",
    4, {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID}, nullptr};

// What the checks write.
Statement kMakeHeads = {
    "UPDATE" OUTBOX "SET ready_at = GREATEST(available_at, $2) "
    "WHERE id = ANY ($1) AND ready_at IS NULL AND state = 'pending'",
    2, {INT8ARRAYOID, TIMESTAMPTZOID}, nullptr};

Statement kUnmakeHeads = {
    "UPDATE" OUTBOX "SET ready_at = NULL WHERE id = ANY ($1) AND ready_at IS NOT NULL "
    "AND state = 'pending'",
    1, {INT8ARRAYOID}, nullptr};

// New places for events (waiting, not heads).
Statement kPlace = {
    "UPDATE" OUTBOX "o SET key_seq = p.place, ready_at = NULL "
    "FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), "
    "     pg_catalog.unnest($2::pg_catalog.int8[])) AS p(id, place) "
    "WHERE o.id = p.id AND o.state = 'pending'",
    2, {INT8ARRAYOID, INT8ARRAYOID}, nullptr};

// Places after every place taken so far: the outbox's id sequence.
Statement kNewPlaces = {
    "SELECT pg_catalog.nextval(pg_catalog.pg_get_serial_sequence($1::pg_catalog.regclass::pg_catalog.text, 'id')) "
    "FROM pg_catalog.generate_series(1, $2)",
    2, {OIDOID, INT4OID}, nullptr};

// A redriven event, and the head of its key other than itself: at or after
// $2, the lowest place of the key's events this transaction redrove (every
// live event of the key is there or later: they died as heads).
Statement kCheckRedriven = {
    "SELECT d.state = 'pending', d.ready_at IS NOT NULL, " PLACE("d") ", h.id, " PLACE("h")
    "  FROM" OUTBOX "d LEFT JOIN LATERAL (SELECT h.id, h.key_seq FROM" OUTBOX "h "
    "       WHERE h.topic = d.topic AND h.key = d.key AND h.state" LIVE
    "         AND h.ready_at IS NOT NULL AND h.id <> d.id AND" PLACE("h") ">= $2"
    "       ORDER BY" PLACE("h") ", h.id LIMIT 1) h ON true "
    " WHERE d.id = $1",
    2, {INT8OID, INT8OID}, nullptr};

Statement kSetRedriven = {
    "UPDATE" OUTBOX "SET ready_at = $2, key_seq = $3 WHERE id = $1 AND state = 'pending'",
    3, {INT8OID, TIMESTAMPTZOID, INT8OID}, nullptr};

// --- what this transaction recorded -------------------------------------------------

enum class Kind : std::uint8_t { Enqueued, Ended, Redriven };

struct Record {
    Kind kind;
    bool head;           // Enqueued: made its key's head at once
    std::int64_t id;     // Enqueued, Redriven: the event; Ended: the head made at once, or 0
    std::int64_t place;  // Ended: the ended head's place; Redriven: the event's, when redriven
    const text* topic;
    const text* key;
    std::uint32_t turn;
    SubTransactionId made_in;
};

// All in TopTransactionContext, gone with the transaction.
Record* records = nullptr;
int record_count = 0;
int record_capacity = 0;
Oid writer = InvalidOid;  // the functions' owner does the checks

const text* copy_text(const text* value) {
    return reinterpret_cast<const text*>(
        DatumGetPointer(datumCopy(PointerGetDatum(value), false, -1)));
}

void add(Kind kind, const text* topic, const text* key, std::int64_t id, std::int64_t place,
         bool head) {
    MemoryContext const old = MemoryContextSwitchTo(TopTransactionContext);
    if (record_count == record_capacity) {
        record_capacity = record_capacity == 0 ? 16 : record_capacity * 2;
        records = static_cast<Record*>(
            records == nullptr ? palloc(sizeof(Record) * record_capacity)
                               : repalloc(records, sizeof(Record) * record_capacity));
    }
    records[record_count++] = Record{kind,           head, id, place, copy_text(topic), copy_text(key),
                                     producer_turn_of(topic, key), GetCurrentSubTransactionId()};
    MemoryContextSwitchTo(old);
    writer = GetUserId();
}

void forget_all() {
    records = nullptr;
    record_count = record_capacity = 0;
    writer = InvalidOid;
}

int compare_text(const text* a, const text* b) {
    const std::size_t la = VARSIZE_ANY_EXHDR(a);
    const std::size_t lb = VARSIZE_ANY_EXHDR(b);
    const int c = std::memcmp(VARDATA_ANY(a), VARDATA_ANY(b), std::min(la, lb));
    if (c != 0) return c;
    return la < lb ? -1 : (la > lb ? 1 : 0);
}

bool same_key(const Record& a, const Record& b) {
    return compare_text(a.topic, b.topic) == 0 && compare_text(a.key, b.key) == 0;
}

// Records in turn, then (topic, key), then kind and id order.
bool record_before(const Record& a, const Record& b) {
    if (a.turn != b.turn) return a.turn < b.turn;
    if (const int c = compare_text(a.topic, b.topic)) return c < 0;
    if (const int c = compare_text(a.key, b.key)) return c < 0;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.id < b.id;
}

void take_turns() {
    std::uint32_t last = kProducerTurns;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].turn == last) continue;
        last = records[i].turn;
        take_producer_turn(last);
    }
}

// --- the checks ----------------------------------------------------------------

Datum text_array_of(const text** values, int count) {
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    for (int i = 0; i < count; ++i) datums[i] = PointerGetDatum(values[i]);
    return text_array(datums, count);
}

Datum int8_array_of(const std::int64_t* values, int count) {
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    for (int i = 0; i < count; ++i) datums[i] = Int64GetDatum(values[i]);
    return int8_array(datums, count);
}

// Growing list of ids (and places) to write, in the current memory context.
struct IdList {
    std::int64_t* ids;
    std::int64_t* places;
    int count;
};

IdList id_list(int capacity) {
    return IdList{static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (capacity + 1))),
                  static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (capacity + 1))), 0};
}

void make_heads(const IdList& list, Micros now) {
    if (list.count == 0) return;
    Params params;
    params.add(int8_array_of(list.ids, list.count)).add_timestamp(now);
    execute_latest(kMakeHeads, params);
    note_ready_written(now);
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

void check_ended(const int* which, int count, Micros now) {
    const text** topics = static_cast<const text**>(palloc(sizeof(text*) * (count + 1)));
    const text** keys = static_cast<const text**>(palloc(sizeof(text*) * (count + 1)));
    auto* places = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (count + 1)));
    auto* made = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (count + 1)));
    for (int i = 0; i < count; ++i) {
        const Record& r = records[which[i]];
        topics[i] = r.topic;
        keys[i] = r.key;
        places[i] = r.place;
        made[i] = r.id;
    }
    Params params;
    params.add(text_array_of(topics, count)).add(text_array_of(keys, count));
    params.add(int8_array_of(places, count)).add(int8_array_of(made, count));
    const std::uint64_t rows = execute_latest(kCheckEnded, params);
    IdList heads = id_list(count);
    int gap_total = 0;
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        Datum* gap = nullptr;
        gap_total += int8_elements(column(4, &isnull, row), &gap);
    }
    IdList moves = id_list(gap_total);
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const bool made_holds = DatumGetBool(column(2, &isnull, row));
        if (made_holds) {
            const std::int64_t head_place = DatumGetInt64(column(3, &isnull, row));
            Datum* gap = nullptr;
            const int n = int8_elements(column(4, &isnull, row), &gap);
            for (int i = 0; i < n; ++i) {
                moves.ids[moves.count] = DatumGetInt64(gap[i]);
                moves.places[moves.count++] = head_place;
            }
            continue;
        }
        const Datum first = column(5, &isnull, row);
        if (isnull) continue;  // nothing left of the key
        if (!DatumGetBool(column(6, &isnull, row))) heads.ids[heads.count++] = DatumGetInt64(first);
    }
    place(moves);
    make_heads(heads, now);
}

void check_redriven(const Record& r, std::int64_t from, bool latest, Micros now) {
    Params params;
    params.add_int8(r.id).add_int8(from);
    const std::uint64_t rows = latest ? execute_latest(kCheckRedriven, params)
                                      : execute(kCheckRedriven, params);
    if (rows == 0) return;
    bool isnull = false;
    if (!DatumGetBool(column(1, &isnull))) return;  // handed out, acked or dead again since
    const bool is_head = DatumGetBool(column(2, &isnull));
    const std::int64_t own_place = DatumGetInt64(column(3, &isnull));
    (void)column(4, &isnull);
    const bool other_head = !isnull;
    const std::int64_t head_place = other_head ? DatumGetInt64(column(5, &isnull)) : 0;
    Params set;
    set.add_int8(r.id);
    if (other_head) {
        // It waits behind the head its key has, next after it.
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

// The enqueued events of one key: records [from, to), in id order.
struct KeyGroup {
    int from;
    int to;
};

void check_enqueued(const KeyGroup* groups, int count, Micros now) {
    int events = 0;
    for (int g = 0; g < count; ++g) events += groups[g].to - groups[g].from;
    auto* mine = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (events + 1)));
    const text** topics = static_cast<const text**>(palloc(sizeof(text*) * (count + 1)));
    const text** keys = static_cast<const text**>(palloc(sizeof(text*) * (count + 1)));
    auto* firsts = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (count + 1)));
    int n = 0;
    for (int g = 0; g < count; ++g) {
        topics[g] = records[groups[g].from].topic;
        keys[g] = records[groups[g].from].key;
        firsts[g] = records[groups[g].from].id;
        for (int i = groups[g].from; i < groups[g].to; ++i) mine[n++] = records[i].id;
    }
    Params params;
    params.add(int8_array_of(mine, n)).add(text_array_of(topics, count));
    params.add(text_array_of(keys, count)).add(int8_array_of(firsts, count));
    const std::uint64_t rows = execute_latest(kCheckEnqueued, params);

    IdList heads = id_list(count);
    IdList unmade = id_list(events);
    auto* later = static_cast<bool*>(palloc0(sizeof(bool) * (count + 1)));
    int to_place = 0;
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const int g = DatumGetInt32(column(1, &isnull, row)) - 1;
        later[g] = DatumGetBool(column(2, &isnull, row));
        const bool earlier = DatumGetBool(column(3, &isnull, row));
        const KeyGroup& group = groups[g];
        if (later[g]) {
            to_place += group.to - group.from;
            continue;
        }
        for (int i = group.from; i < group.to; ++i) {
            const bool should_head = !earlier && i == group.from;
            if (records[i].head && !should_head) unmade.ids[unmade.count++] = records[i].id;
            if (!records[i].head && should_head) heads.ids[heads.count++] = records[i].id;
        }
    }
    unmake_heads(unmade);
    make_heads(heads, now);
    if (to_place == 0) return;
    // Another transaction's event of the key committed first with a later
    // place: this transaction's events of the key go after it, in order.
    Params next;
    next.add(ObjectIdGetDatum(extension_objects().outbox)).add_int4(to_place);
    execute(kNewPlaces, next);
    IdList placed = id_list(to_place);
    for (int g = 0; g < count; ++g) {
        if (!later[g]) continue;
        for (int i = groups[g].from; i < groups[g].to; ++i) {
            bool isnull = false;
            placed.places[placed.count] = DatumGetInt64(column(1, &isnull, placed.count));
            placed.ids[placed.count++] = records[i].id;
        }
    }
    place(placed);
}

void check_all() {
    std::sort(records, records + record_count, record_before);
    take_turns();
    const Micros now = GetCurrentTimestamp();
    int* ended = static_cast<int*>(palloc(sizeof(int) * (record_count + 1)));
    KeyGroup* groups = static_cast<KeyGroup*>(palloc(sizeof(KeyGroup) * (record_count + 1)));
    int ended_count = 0;
    int group_count = 0;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].kind == Kind::Ended) ended[ended_count++] = i;
        if (records[i].kind != Kind::Enqueued) continue;
        if (group_count > 0 && same_key(records[groups[group_count - 1].from], records[i]))
            groups[group_count - 1].to = i + 1;
        else
            groups[group_count++] = KeyGroup{i, i + 1};
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
    PopActiveSnapshot();
    leave_owner_scope(scope);
}

void on_transaction_event(XactEvent event, void*) {
    if (records == nullptr) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
    case XACT_EVENT_PRE_PREPARE:
        before_commit();
        record_count = 0;
        break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
        forget_all();
        break;
    default:
        break;
    }
}

// A rolled-back subtransaction takes its records back; a committed one
// hands them to its parent.
void on_subtransaction_event(SubXactEvent event, SubTransactionId mine, SubTransactionId parent,
                             void*) {
    if (records == nullptr) return;
    if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) return;
    int kept = 0;
    for (int i = 0; i < record_count; ++i) {
        if (records[i].made_in == mine) {
            if (event == SUBXACT_EVENT_ABORT_SUB) continue;
            records[i].made_in = parent;
        }
        records[kept++] = records[i];
    }
    record_count = kept;
}

}  // namespace

void enqueued_keyed(const text* topic, const text* key, std::int64_t id, bool head) {
    add(Kind::Enqueued, topic, key, id, 0, head);
}

void heads_ended(const EndedHeads& ended, Micros now) {
    if (ended.count == 0) return;
    auto* made = static_cast<std::int64_t*>(palloc0(sizeof(std::int64_t) * (ended.count + 1)));
    Params params;
    params.add(text_array_of(ended.topics, ended.count));
    params.add(text_array_of(ended.keys, ended.count));
    params.add(int8_array_of(ended.places, ended.count)).add_timestamp(now);
    const std::uint64_t rows = execute(kPromoteNext, params);
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const int i = DatumGetInt32(column(1, &isnull, row)) - 1;
        made[i] = DatumGetInt64(column(2, &isnull, row));
    }
    if (rows > 0) note_ready_written(now);
    for (int i = 0; i < ended.count; ++i)
        add(Kind::Ended, ended.topics[i], ended.keys[i], made[i], ended.places[i], false);
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
    EndedHeads out{static_cast<const text**>(palloc(sizeof(text*) * (rows + 1))),
                   static_cast<const text**>(palloc(sizeof(text*) * (rows + 1))),
                   static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (rows + 1))), 0};
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
