#include "pg/outbox_store.hpp"

#include "pg/extension_objects.hpp"
#include "pg/producer_turn.hpp"
#include "pg/spi.hpp"

namespace idem::pg {

namespace {

#define OUTBOX " @outbox@ "

Statement kInsert = {
    "INSERT INTO" OUTBOX "(topic, key, payload, headers, dedup_key, enqueued_at, available_at, "
    "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $6) RETURNING id",
    7, {TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kInsertDeduplicated = {
    "INSERT INTO" OUTBOX "(topic, key, payload, headers, dedup_key, enqueued_at, available_at, "
    "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $6) "
    "ON CONFLICT (topic, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id",
    7, {TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kFindDeduplicated = {
    "SELECT id FROM" OUTBOX "WHERE topic = $1 AND dedup_key = $2", 2, {TEXTOID, TEXTOID},
    nullptr};

// A late ack (after the lease ran out and the event went back to pending)
// still counts: the event was delivered.
Statement kAck = {
    "UPDATE" OUTBOX "SET state = 'delivered', delivered_at = $2, lease_until = NULL, "
    "updated_at = $2 WHERE id = ANY ($1) AND (state = 'in_flight' OR "
    "(state = 'pending' AND attempts > 0))",
    2, {INT8ARRAYOID, TIMESTAMPTZOID}, nullptr};

Statement kWriteClaims = {
    "UPDATE" OUTBOX "o SET state = 'in_flight', attempts = o.attempts + 1, "
    "lease_until = h.lease_until, relay = h.relay, updated_at = h.claimed_at"
    "@if outbox.max_attempts@, max_attempts = h.cap@end@ "
    "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), "
    "pg_catalog.unnest($4), pg_catalog.unnest($5)) AS h(id, lease_until, relay, claimed_at, cap) "
    "WHERE o.id = h.id AND o.state IN ('pending', 'in_flight')",
    5, {INT8ARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT4ARRAYOID},
    nullptr};

Statement kAckHeld = {
    "UPDATE" OUTBOX "o SET state = 'delivered', attempts = o.attempts + 1, relay = h.relay, "
    "delivered_at = $3, lease_until = NULL, updated_at = $3 "
    "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS h(id, relay) "
    "WHERE o.id = h.id AND o.state IN ('pending', 'in_flight')",
    3, {INT8ARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID}, nullptr};

Statement kLock = {
    "SELECT state, state::pg_catalog.text, attempts, "
    "@if outbox.max_attempts@max_attempts@else@NULL::pg_catalog.int4@end@ FROM" OUTBOX
    "WHERE id = $1 FOR NO KEY UPDATE",
    1, {INT8OID}, nullptr};

Statement kRetryOrBury = {
    "UPDATE" OUTBOX "SET state = $2, last_error = $3, available_at = $4, lease_until = NULL, "
    "updated_at = $5, attempts = $6, relay = COALESCE($7, relay) WHERE id = $1",
    7, {INT8OID, kOutboxStateType, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID},
    nullptr};

// Events in flight that the relay claimed go back to pending, due now, the
// attempt their claim counted given back.
Statement kRelease = {
    "UPDATE" OUTBOX "SET state = 'pending', attempts = attempts - 1, available_at = $3, "
    "lease_until = NULL, updated_at = $3 WHERE id = ANY ($1) AND state = 'in_flight' "
    "AND relay = $2",
    3, {INT8ARRAYOID, TEXTOID, TIMESTAMPTZOID}, nullptr};

Statement kRedrive = {
    "UPDATE" OUTBOX "SET state = 'pending', attempts = 0, available_at = $3, "
    "lease_until = NULL, updated_at = $3 WHERE state = 'dead' "
    "AND ($1::pg_catalog.int8[] IS NULL OR id = ANY ($1)) "
    "AND ($2::pg_catalog.text IS NULL OR topic = $2) "
    "AND ($4::pg_catalog.text[] IS NULL OR topic = ANY ($4))",
    4, {INT8ARRAYOID, TEXTOID, TIMESTAMPTZOID, TEXTARRAYOID}, nullptr};

Statement kExpireLeases = {
    "WITH due AS (SELECT id FROM" OUTBOX "WHERE state = 'in_flight' AND lease_until <= $1 "
    "  LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED) "
    "UPDATE" OUTBOX "o SET state = CASE WHEN o.attempts >= "
    "@if outbox.max_attempts@COALESCE(o.max_attempts, $3)@else@$3@end@ THEN $4 ELSE $5 END, "
    "available_at = $1, lease_until = NULL, last_error = 'lease expired', updated_at = $1 "
    "FROM due WHERE o.id = due.id AND o.state = 'in_flight' RETURNING o.state = 'dead'",
    5, {TIMESTAMPTZOID, INT4OID, INT4OID, kOutboxStateType, kOutboxStateType}, nullptr};

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

std::int64_t insert_event(const NewEvent& event, Micros now, bool* inserted) {
    if (event.key != nullptr) take_producer_turn(event.topic, event.key);
    Params params;
    params.add_text(event.topic).add_text(event.key).add(event.payload);
    params.add_datum(event.headers, event.has_headers).add_text(event.dedup_key);
    params.add_timestamp(now).add_timestamp(event.available_at);
    if (event.dedup_key == nullptr) {
        execute(kInsert, params);
        *inserted = true;
        return *column_int8(1);
    }
    // A concurrent enqueue of the same dedup_key: ON CONFLICT waits for its
    // transaction; then its row is visible (or gone after a rollback, or
    // purged): loop until one of the two statements finds an id.
    Params lookup;
    lookup.add_text(event.topic).add_text(event.dedup_key);
    for (;;) {
        if (execute(kInsertDeduplicated, params) > 0) {
            *inserted = true;
            return *column_int8(1);
        }
        if (execute(kFindDeduplicated, lookup, 1) > 0) {
            *inserted = false;
            return *column_int8(1);
        }
        CHECK_FOR_INTERRUPTS();
    }
}

std::uint64_t ack_events(Datum ids, Micros now) {
    Params params;
    params.add(ids).add_timestamp(now);
    return execute(kAck, params);
}

void write_claims(const ClaimedEvents& events) {
    Params params;
    params.add(events.ids).add(events.lease_untils).add(events.relays).add(events.claimed_ats);
    params.add(events.max_attempts);
    execute(kWriteClaims, params);
}

std::uint64_t ack_held_events(Datum ids, Datum relays, Micros now) {
    Params params;
    params.add(ids).add(relays).add_timestamp(now);
    return execute(kAckHeld, params);
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
    params.add_text(failure.claimed_by);
    execute(kRetryOrBury, params);
}

std::uint64_t redrive_events(Datum ids, bool has_ids, const text* topic, Micros now,
                             Datum topics, bool has_topics) {
    Params params;
    params.add_datum(ids, has_ids).add_text(topic).add_timestamp(now);
    params.add_datum(topics, has_topics);
    return execute(kRedrive, params);
}

std::uint64_t release_events(Datum ids, const text* relay, Micros now) {
    Params params;
    params.add(ids).add_text(relay).add_timestamp(now);
    return execute(kRelease, params);
}

std::uint64_t expire_event_leases(int batch, int max_attempts, Micros now, std::uint64_t* dead) {
    Params params;
    params.add_timestamp(now).add_int4(batch).add_int4(max_attempts);
    params.add(outbox_state_value("dead")).add(outbox_state_value("pending"));
    const std::uint64_t expired = execute(kExpireLeases, params);
    *dead = 0;
    for (std::uint64_t row = 0; row < expired; ++row) {
        bool isnull = false;
        if (DatumGetBool(column(1, &isnull, row))) ++*dead;
    }
    return expired;
}

std::uint64_t purge_delivered_events(int batch, Micros cutoff) {
    Params params;
    params.add_timestamp(cutoff).add_int4(batch);
    return execute(kPurgeDelivered, params);
}

}  // namespace idem::pg
