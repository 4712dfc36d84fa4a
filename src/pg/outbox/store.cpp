#include "pg/outbox/store.hpp"

#include <algorithm>

#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/outbox/counts.hpp"
#include "pg/outbox/heads.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/index.hpp"
#include "pg/outbox/layout.hpp"
#include "pg/outbox/producer_turn.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/outbox/rows.hpp"

namespace idem::pg {

namespace {

#define OUTBOX " @outbox@ "
// The ready-queue layout (0.5.0) and what it writes.
#define IF_READY(then) "@if outbox.ready_at@" then "@end@"
#define IF_READY_ELSE(then, otherwise) "@if outbox.ready_at@" then "@else@" otherwise "@end@"
// An event's place in its key's order.
#define PLACE " COALESCE(key_seq, id) "
// The topic, key (only when `cond`) and place of each changed event, for
// the heads that ended with the change (pg/outbox/heads.hpp).
#define ENDED_HEADS(cond)                                                        \
    IF_READY_ELSE(", topic, CASE WHEN " cond " THEN key END, " PLACE,               \
                  ", NULL::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.int8")

// A keyed event without a ready place: it waits behind its key's head (a
// follower in the head's run, when in flight), and keeps waiting when its
// nack, release or expired lease makes it pending again. `row`: the
// statement's alias for the row with its dot ("o."), or "".
#define FOLLOWER(row) " (" row "key IS NOT NULL AND " row "ready_at IS NULL) "

// $8: whether the new event is its key's head (always for an event without
// a key); due from deliver_at, or now. $9: its id, taken from the sequence
// first (with the ready queue).
#define INSERT_EVENT                                                                            \
    "INSERT INTO" OUTBOX "(" IF_READY("id, ") "topic, key, payload, headers, dedup_key, "             \
    "enqueued_at, available_at, updated_at" IF_READY(", ready_at") ") "                              \
    IF_READY("OVERRIDING SYSTEM VALUE ") "VALUES (" IF_READY("$9, ") "$1, $2, $3, $4, $5, $6, $7, $6" \
    IF_READY(", CASE WHEN $8 THEN GREATEST($7, $6) END") ") "
#define RETURNING_EVENT " RETURNING id, " IF_READY_ELSE("ready_at IS NOT NULL", "false")

Statement kInsert = {
    INSERT_EVENT RETURNING_EVENT,
    9, {TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, BOOLOID,
        INT8OID},
    nullptr};

Statement kInsertDeduplicated = {
    INSERT_EVENT "ON CONFLICT (topic, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"
    RETURNING_EVENT,
    9, {TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, BOOLOID,
        INT8OID},
    nullptr};

Statement kFindDeduplicated = {
    "SELECT id FROM" OUTBOX "WHERE topic = $1 AND dedup_key = $2", 2, {TEXTOID, TEXTOID},
    nullptr};

Statement kLock = {
    "SELECT state, state::pg_catalog.text, attempts, "
    "@if outbox.max_attempts@max_attempts@else@NULL::pg_catalog.int4@end@ FROM" OUTBOX
    "WHERE id = $1 FOR NO KEY UPDATE",
    1, {INT8OID}, nullptr};

Statement kRetryOrBury = {
    "UPDATE" OUTBOX "SET state = $2, last_error = $3, available_at = $4, lease_until = NULL, "
    "updated_at = $5, attempts = $6, relay = COALESCE($7, relay)"
    "@if outbox.max_attempts@, max_attempts = COALESCE($8, max_attempts)@end@"
    IF_READY(", ready_at = CASE WHEN $2 = 'dead' OR " FOLLOWER("") " THEN NULL ELSE $4 END")
    " WHERE id = $1 RETURNING id" ENDED_HEADS("false"),
    8, {INT8OID, kOutboxStateType, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID, INT4OID},
    nullptr};

// Events in flight that the relay claimed go back to pending, due now, the
// attempt their claim counted given back.
Statement kRelease = {
    "UPDATE" OUTBOX "SET state = 'pending', attempts = attempts - 1, available_at = $3, "
    "lease_until = NULL, updated_at = $3"
    IF_READY(", ready_at = CASE WHEN" FOLLOWER("") "THEN NULL ELSE $3 END")
    " WHERE id = ANY ($1) AND state = 'in_flight' "
    "AND relay = $2 RETURNING topic, attempts",
    3, {INT8ARRAYOID, TEXTOID, TIMESTAMPTZOID}, nullptr};

Statement kRedrive = {
    "UPDATE" OUTBOX "SET state = 'pending', attempts = 0, available_at = $3, "
    "lease_until = NULL, updated_at = $3" IF_READY(", ready_at = CASE WHEN key IS NULL THEN $3 END")
    " WHERE state = 'dead' "
    "AND ($1::pg_catalog.int8[] IS NULL OR id = ANY ($1)) "
    "AND ($2::pg_catalog.text IS NULL OR topic = $2) "
    "AND ($4::pg_catalog.text[] IS NULL OR topic = ANY ($4)) RETURNING id" ENDED_HEADS("true"),
    4, {INT8ARRAYOID, TEXTOID, TIMESTAMPTZOID, TEXTARRAYOID}, nullptr};

Statement kExpireLeases = {
    "WITH due AS (SELECT id FROM" OUTBOX "WHERE state = 'in_flight' AND lease_until <= $1 "
    "  LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE" OUTBOX "o SET state = CASE WHEN o.attempts >= "
    "@if outbox.max_attempts@COALESCE(o.max_attempts, $3)@else@$3@end@ THEN $4 ELSE $5 END, "
    "available_at = $1, lease_until = NULL, last_error = 'lease expired', updated_at = $1"
    // (The ready-queue layout always has max_attempts.)
    IF_READY(", ready_at = CASE WHEN o.attempts >= COALESCE(o.max_attempts, $3) "
             "OR" FOLLOWER("o.") "THEN NULL ELSE $1 END")
    " FROM due WHERE o.id = due.id AND o.state = 'in_flight' RETURNING o.state = 'dead'"
    IF_READY_ELSE(", o.topic, NULL::pg_catalog.text, COALESCE(o.key_seq, o.id)",
                  ", NULL::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.int8"),
    5, {TIMESTAMPTZOID, INT4OID, INT4OID, kOutboxStateType, kOutboxStateType}, nullptr};

// Dead events an operator gives up on: deleted; the next event of a key
// whose first event (in its order) was the discarded one becomes its head.
Statement kDiscard = {
    "DELETE FROM" OUTBOX "o WHERE o.id = ANY ($1) AND o.state = 'dead' "
    "AND ($2::pg_catalog.text[] IS NULL OR o.topic = ANY ($2)) RETURNING o.id"
    IF_READY_ELSE(", o.topic, CASE WHEN o.key IS NOT NULL AND NOT EXISTS (SELECT FROM" OUTBOX "e "
                  "  WHERE e.topic = o.topic AND e.key = o.key AND e.id <> o.id "
                  "    AND e.state IN ('pending', 'in_flight', 'dead') "
                  "    AND COALESCE(e.key_seq, e.id) < COALESCE(o.key_seq, o.id)) THEN o.key END, "
                  "COALESCE(o.key_seq, o.id)",
                  ", NULL::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.int8"),
    2, {INT8ARRAYOID, TEXTARRAYOID}, nullptr};

Statement kPurgeDelivered = {
    "DELETE FROM" OUTBOX "WHERE id = ANY (ARRAY("
    "  SELECT id FROM" OUTBOX "WHERE state = 'delivered' AND delivered_at <= $1 "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

}  // namespace

Datum outbox_state_value(const char* label) {
    return DirectFunctionCall2(enum_in, CStringGetDatum(label),
                               ObjectIdGetDatum(extension_objects().outbox_state_type));
}

namespace {

// The event an INSERT ... RETURNING id, <head> inserted (SPI_tuptable).
InsertedEvent returned_event() {
    bool isnull = false;
    return InsertedEvent{*column_int8(1), DatumGetBool(column(2, &isnull))};
}

// The new event's id; with the ready queue, records a keyed event for the
// check before the commit (pg/outbox/heads.hpp).
std::int64_t enqueued(const NewEvent& event, Micros now, bool ready_queue, std::uint64_t seen,
                      const InsertedEvent& made) {
    if (made.head) note_ready_written(std::max(now, event.available_at));
    if (ready_queue && event.key != nullptr)
        enqueued_keyed(event.topic, event.key, made.id, made.head, seen);
    return made.id;
}

// The rows of SPI_tuptable that ended heads: columns `first` on.
void end_heads_in_result(int first, Micros now) {
    const EndedHeads ended = ended_heads_in_result(first);
    heads_ended(ended, now);
}

}  // namespace

std::int64_t insert_event(const NewEvent& event, Micros now, bool* inserted) {
    // Before the ready queue, producers of a key take turns for their whole
    // transaction; with it, only in the step before the commit.
    const bool ready_queue = outbox_has_ready_queue();
    if (event.key != nullptr && !ready_queue) take_producer_turn(event.topic, event.key);
    // A keyed event is its key's head when its key has no live event (the
    // newest is looked for: it is live whenever any is); the check before
    // the commit corrects what a concurrent commit changes.
    bool head = !ready_queue || event.key == nullptr;
    // The turn's count is read before the id is taken and the key looked
    // at: a commit it does not count took its places before this id, and
    // the look back from this id sees them (pg/outbox/producer_turn.hpp).
    const std::uint64_t seen =
        event.key != nullptr && ready_queue ? turn_count(producer_turn_of(event.topic, event.key))
                                            : kNoCount;
    const std::int64_t id = ready_queue ? next_event_id() : 0;
    if (!head) {
        KeyOrderReader reader = open_key_order();
        head = !last_event_before(&reader, event.topic, event.key, id).found;
        close_key_order(&reader);
    }
    if (ready_queue && event.dedup_key == nullptr) {
        const InsertedEvent made = insert_new_event(event, now, id, head);
        *inserted = true;
        return enqueued(event, now, ready_queue, seen, made);
    }
    Params params;
    params.add_text(event.topic).add_text(event.key).add(event.payload);
    params.add_datum(event.headers, event.has_headers).add_text(event.dedup_key);
    params.add_timestamp(now).add_timestamp(event.available_at);
    params.add(BoolGetDatum(head)).add_int8(id);
    connect_spi();
    std::int64_t found = 0;
    if (event.dedup_key == nullptr) {
        execute(kInsert, params);
        *inserted = true;
        found = enqueued(event, now, ready_queue, seen, returned_event());
    } else {
        // A concurrent enqueue of the same dedup_key: ON CONFLICT waits for
        // its transaction; then its row is visible (or gone after a
        // rollback, or purged): loop until one of the two statements finds
        // an id.
        Params lookup;
        lookup.add_text(event.topic).add_text(event.dedup_key);
        for (;;) {
            if (execute(kInsertDeduplicated, params) > 0) {
                *inserted = true;
                found = enqueued(event, now, ready_queue, seen, returned_event());
                break;
            }
            if (execute(kFindDeduplicated, lookup, 1) > 0) {
                *inserted = false;
                found = *column_int8(1);
                break;
            }
            CHECK_FOR_INTERRUPTS();
        }
    }
    finish_spi();
    return found;
}

std::uint64_t discard_events(Datum ids, Datum topics, bool has_topics, Micros now) {
    Params params;
    params.add(ids).add_datum(topics, has_topics);
    const std::uint64_t discarded = execute(kDiscard, params);
    count_result_rows(EventsLeft::Discarded, 2, now);
    end_heads_in_result(2, now);
    return discarded;
}

namespace {

// What the rows a direct change acked did: delivered, and their heads ended.
std::uint64_t acked(const ChangedEvents& changed, Micros now) {
    for (int i = 0; i < changed.topic_count; ++i)
        count_events_left(EventsLeft::Delivered, changed.topics[i], now);
    heads_ended(changed.ended, now);
    return changed.count;
}

}  // namespace

std::uint64_t ack_events(const Datum* ids, int count, Micros now) {
    return acked(ack_by_id(ids, HeldClaims{}, nullptr, count, now), now);
}

void write_claims(const ClaimedEvents& events) {
    write_claims_by_id(events.ids, events.lease_untils, events.relays, events.claimed_ats,
                       events.max_attempts, events.followers, events.count);
}

std::uint64_t ack_held_events(const Datum* ids, const Datum* relays, const Datum* caps,
                              const ItemPointerData* versions, int count, Micros now) {
    return acked(ack_by_id(ids, HeldClaims{relays, caps}, versions, count, now), now);
}

bool lock_event(std::int64_t id, EventState* out) {
    Params params;
    params.add_int8(id);
    if (execute(kLock, params, 1) == 0) return false;
    bool isnull = false;
    out->state = column(1, &isnull);
    out->state_type = SPI_gettypeid(SPI_tuptable->tupdesc, 1);
    out->label = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
    out->attempts = DatumGetInt32(column(3, &isnull));
    const Datum cap = column(4, &isnull);
    out->max_attempts = isnull ? std::nullopt : std::optional<std::int32_t>(DatumGetInt32(cap));
    return true;
}

void retry_or_bury(std::int64_t id, const Failure& failure, Micros now) {
    Params params;
    params.add_int8(id).add(outbox_state_value(failure.dead ? "dead" : "pending"));
    params.add_text(failure.error);
    params.add_timestamp(failure.available_at).add_timestamp(now).add_int4(failure.attempts);
    if (failure.held_claim != nullptr)
        params.add_text(failure.held_claim->relay).add_int4(failure.held_claim->max_attempts);
    else
        params.add_text(nullptr).add_datum(0, false);
    execute(kRetryOrBury, params);
    if (failure.dead) count_result_rows(EventsLeft::Died, 2, now);
    if (!failure.dead) note_ready_written(failure.available_at);
    end_heads_in_result(2, now);
}

std::uint64_t redrive_events(Datum ids, bool has_ids, const text* topic, Micros now,
                             Datum topics, bool has_topics) {
    Params params;
    params.add_datum(ids, has_ids).add_text(topic).add_timestamp(now);
    params.add_datum(topics, has_topics);
    const std::uint64_t redriven = execute(kRedrive, params);
    count_result_rows(EventsLeft::Redriven, 2, now);
    if (redriven == 0 || !outbox_has_ready_queue()) return redriven;
    note_ready_written(now);
    // Each keyed event becomes its key's head, or waits behind the head its
    // key has; one after the other, in id order, so that each sees the last.
    const EndedHeads keyed = ended_heads_in_result(2);
    auto* event_ids = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (redriven + 1)));
    int count = 0;
    for (std::uint64_t row = 0; row < redriven; ++row) {
        bool no_key = false;
        (void)column(3, &no_key, row);
        if (!no_key) event_ids[count++] = *column_int8(1, row);
    }
    int* order = static_cast<int*>(palloc(sizeof(int) * (count + 1)));
    for (int i = 0; i < count; ++i) order[i] = i;
    std::sort(order, order + count, [&](int a, int b) { return event_ids[a] < event_ids[b]; });
    for (int i = 0; i < count; ++i) {
        const int at = order[i];
        redriven_keyed(event_ids[at], keyed.topics[at], keyed.keys[at], keyed.places[at], now);
    }
    return redriven;
}

std::uint64_t release_events(Datum ids, const text* relay, Micros now) {
    Params params;
    params.add(ids).add_text(relay).add_timestamp(now);
    note_ready_written(now);
    const std::uint64_t released = execute(kRelease, params);
    for (std::uint64_t row = 0; row < released; ++row) {
        bool isnull = false;
        count_event_released(DatumGetTextPP(column(1, &isnull, row)),
                             DatumGetInt32(column(2, &isnull, row)));
    }
    return released;
}

std::uint64_t expire_event_leases(int batch, int max_attempts, Micros now, std::uint64_t* dead) {
    Params params;
    params.add_timestamp(now).add_int4(batch).add_int4(max_attempts);
    params.add(outbox_state_value("dead")).add(outbox_state_value("pending"));
    const std::uint64_t expired = execute(kExpireLeases, params);
    count_expired_rows(1, 2);
    *dead = 0;
    for (std::uint64_t row = 0; row < expired; ++row) {
        bool isnull = false;
        if (DatumGetBool(column(1, &isnull, row))) ++*dead;
    }
    if (expired > 0) note_ready_written(now);
    end_heads_in_result(2, now);
    return expired;
}

std::uint64_t purge_delivered_events(int batch, Micros cutoff) {
    Params params;
    params.add_timestamp(cutoff).add_int4(batch);
    return execute(kPurgeDelivered, params);
}

}  // namespace idem::pg
