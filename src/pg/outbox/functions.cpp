// SQL entry points of the transactional outbox: outbox_enqueue,
// outbox_claim, outbox_ack, outbox_nack and outbox_redrive.
#include <cstring>

#include "core/error.hpp"
#include "core/retry.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/arrays.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/claim.hpp"
#include "pg/outbox/counts.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/notify.hpp"
#include "pg/outbox/relay_scope.hpp"
#include "pg/outbox/store.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/metrics.hpp"

extern "C" {
#include "common/pg_prng.h"
#include "utils/array.h"
}

namespace idem::pg {

namespace {

bool same_text(const text* a, const text* b) {
    return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
           memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

// A jsonb argument that must be a JSON object when given.
Datum headers_arg(FunctionCallInfo fcinfo, int n) {
    const Datum headers = optional_jsonb_arg(fcinfo, n, "headers");
    if (PG_ARGISNULL(n)) return 0;
    Jsonb* jsonb = DatumGetJsonbP(headers);
    if (!JB_ROOT_IS_OBJECT(jsonb) || JB_ROOT_IS_SCALAR(jsonb))
        throw Error(sqlstate::invalid_parameter, "headers must be a JSON object");
    return headers;
}

// An optional, non-empty name (the outbox key, a dedup_key).
text* optional_nonempty_name(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) return nullptr;
    return name_arg(fcinfo, n, name);
}

Micros deliver_at_arg(FunctionCallInfo fcinfo, int n, Micros now) {
    if (PG_ARGISNULL(n)) return now;
    const TimestampTz value = PG_GETARG_TIMESTAMPTZ(n);
    if (TIMESTAMP_NOT_FINITE(value))
        throw Error(sqlstate::invalid_parameter, "deliver_at must be a finite timestamp");
    return value;
}

// A bigint[] argument without NULL elements.
Datum ids_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) throw_null_argument(name);
    ArrayType* ids = PG_GETARG_ARRAYTYPE_P(n);
    if (array_contains_nulls(ids)) throw_null_argument("an element of ids");
    return PointerGetDatum(ids);
}

// The topics filter (NULL: every topic). Its elements are checked when the
// claim reads the list (pg/outbox/topic_set.hpp), once per list.
Datum topics_arg(FunctionCallInfo fcinfo, int n) {
    return PointerGetDatum(PG_GETARG_ARRAYTYPE_P(n));
}

Datum enqueue_body(FunctionCallInfo fcinfo) {
    NewEvent event;
    event.topic = name_arg(fcinfo, 0, "topic");
    if (PG_ARGISNULL(1)) throw_null_argument("payload");
    event.payload = optional_jsonb_arg(fcinfo, 1, "payload");
    event.key = optional_nonempty_name(fcinfo, 2, "key");
    event.headers = headers_arg(fcinfo, 3);
    event.has_headers = !PG_ARGISNULL(3);
    event.dedup_key = optional_nonempty_name(fcinfo, 4, "dedup_key");
    const Micros now = GetCurrentTimestamp();
    event.available_at = deliver_at_arg(fcinfo, 5, now);

    bool inserted = false;
    const std::int64_t id = insert_event(event, now, &inserted);
    // Delivered to listeners only if this transaction commits.
    if (inserted) notify_outbox_on_commit(event.topic);
    if (inserted) count_event_enqueued(event.topic);
    count_on_commit(inserted ? Counter::OutboxEnqueued : Counter::OutboxDeduplicated);
    PG_RETURN_INT64(id);
}

// Where outbox_claim's events go: the function's result set.
struct HandedOutEvents {
    ReturnSetInfo* rsinfo;
    std::uint64_t expired;  // of them, handed out again after a lease ran out
};

void put_handed_out(const HandedOutEvent& event, void* context) {
    HandedOutEvents* out = static_cast<HandedOutEvents*>(context);
    tuplestore_putvalues(out->rsinfo->setResult, out->rsinfo->setDesc,
                         const_cast<Datum*>(event.values), const_cast<bool*>(event.nulls));
    if (event.lease_ran_out) ++out->expired;
    count_event_claimed(DatumGetTextPP(event.values[1]), DatumGetInt32(event.values[6]));
}

Datum claim_body(FunctionCallInfo fcinfo) {
    ClaimRequest request;
    request.relay = name_arg(fcinfo, 0, "relay");
    if (PG_ARGISNULL(1)) throw_null_argument("batch");
    const std::int64_t batch = PG_GETARG_INT32(1);
    check_batch("batch", batch);
    request.batch = static_cast<int>(batch);
    const Micros lease = lease_arg(fcinfo, 2, "lease");
    const bool has_requested = !PG_ARGISNULL(3);
    const Datum requested = has_requested ? topics_arg(fcinfo, 3) : 0;
    request.max_attempts = settings::outbox_max_attempts;
    request.run_length = settings::outbox_run_length;

    InitMaterializedSRF(fcinfo, 0);
    HandedOutEvents out{reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo), 0};
    connect_spi();
    request.topics = claimable_topics(relay_scope(), requested, has_requested);
    const Micros now = GetCurrentTimestamp();
    request.lease_until = now + lease;
    claim_events(request, now, put_handed_out, &out);
    finish_spi();
    // Handed out again after a lease ran out: a retry, as when the sweep
    // returns such an event to pending first.
    count_on_commit(Counter::OutboxRetried, out.expired);
    return 0;
}

// Acks the events this transaction holds with their claims' changes, and
// the others as they are; returns how many changed.
std::uint64_t ack_held_and_others(const Datum* ids, int count, Micros now) {
    Datum* held = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    Datum* relays = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    Datum* caps = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    Datum* others = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    auto* versions = static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * (count + 1)));
    int held_count = 0;
    int other_count = 0;
    for (int i = 0; i < count; ++i) {
        if (const ClaimWrite* claim = settle_held(DatumGetInt64(ids[i]), &versions[held_count])) {
            relays[held_count] = PointerGetDatum(claim->relay);
            caps[held_count] = Int32GetDatum(claim->max_attempts);
            held[held_count++] = ids[i];
        } else {
            others[other_count++] = ids[i];
        }
    }
    std::uint64_t changed = 0;
    if (held_count > 0) changed += ack_held_events(held, relays, caps, versions, held_count, now);
    if (other_count > 0) changed += ack_events(others, other_count, now);
    return changed;
}

Datum ack_body(FunctionCallInfo fcinfo) {
    const Datum ids = ids_arg(fcinfo, 0, "ids");
    const Micros now = GetCurrentTimestamp();
    connect_spi();
    check_event_topics(relay_scope(), ids, "ack");
    Datum* elements = nullptr;
    const int count = int8_elements(ids, &elements);
    const std::uint64_t changed = holds_any() ? ack_held_and_others(elements, count, now)
                                              : ack_events(elements, count, now);
    finish_spi();
    count_on_commit(Counter::OutboxDelivered, changed);
    if (changed > 0)
        note_due_on_commit(DueKind::Retention, now + settings::seconds(settings::outbox_retention_s));
    PG_RETURN_INT64(static_cast<int64>(changed));
}

Datum nack_body(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(0)) throw_null_argument("id");
    const std::int64_t id = PG_GETARG_INT64(0);
    const text* error = value_text_arg(fcinfo, 1, "error");
    if (PG_ARGISNULL(2)) throw_null_argument("retryable");
    const bool retryable = PG_GETARG_BOOL(2);
    const std::optional<Micros> retry_in = span_arg(fcinfo, 3, "retry_in");

    connect_spi();
    const Datum one_id = Int64GetDatum(id);
    check_event_topics(relay_scope(), int8_array(&one_id, 1), "nack");
    EventState event;
    if (!lock_event(id, &event)) {
        throw_error(sqlstate::no_such_key, "outbox event %lld does not exist",
                    static_cast<long long>(id));
    }
    // Only an event in flight can fail; a pending, delivered or dead event
    // keeps its state. An event this transaction holds is in flight, its
    // claim not yet written: the nack writes it (one more attempt, the
    // claim's relay and cap).
    const ClaimWrite* claim = settle_held(id);
    const bool handed_out = claim != nullptr || strcmp(event.label, "in_flight") == 0;
    // The cap its claim recorded (a held claim's is in its write).
    const std::int32_t cap = claim != nullptr
                                 ? claim->max_attempts
                                 : event.max_attempts.value_or(settings::outbox_max_attempts);
    const RetryPolicy policy{cap,
                             settings::ms(settings::retry_base_delay_ms),
                             settings::ms(settings::retry_max_delay_ms)};
    Datum result = event.state;
    if (handed_out) {
        const Micros now = GetCurrentTimestamp();
        const std::int32_t attempts = event.attempts + (claim != nullptr ? 1 : 0);
        const FailDecision decision = decide_fail(attempts, retryable, retry_in, policy,
                                                  pg_prng_double(&pg_global_prng_state));
        const bool dead = decision.next == Status::FailedFinal;
        const Micros due = now + decision.delay.value_or(0);
        retry_or_bury(id, Failure{dead, error, due, attempts, claim}, now);
        count_on_commit(dead ? Counter::OutboxDead : Counter::OutboxRetried);
        result = DirectFunctionCall2(enum_in, CStringGetDatum(dead ? "dead" : "pending"),
                                     ObjectIdGetDatum(event.state_type));
    }
    finish_spi();
    return result;
}

Datum redrive_body(FunctionCallInfo fcinfo) {
    const bool has_ids = !PG_ARGISNULL(0);
    const Datum ids = has_ids ? ids_arg(fcinfo, 0, "ids") : 0;
    const text* topic = PG_ARGISNULL(1) ? nullptr : name_arg(fcinfo, 1, "topic");
    connect_spi();
    // A relay role redrives only its own topics' dead letters.
    const RelayScope scope = relay_scope();
    if (topic != nullptr) check_topic(scope, topic, "redrive");
    if (has_ids) check_event_topics(scope, ids, "redrive");
    const std::uint64_t changed = redrive_events(ids, has_ids, topic, GetCurrentTimestamp(),
                                                 scope.topics, scope.limited);
    finish_spi();
    PG_RETURN_INT64(static_cast<int64>(changed));
}

// Gives up on dead events: they are deleted, and each key they held back
// goes on with its next event. A relay role discards only its own topics'.
Datum discard_body(FunctionCallInfo fcinfo) {
    const Datum ids = ids_arg(fcinfo, 0, "ids");
    connect_spi();
    const RelayScope scope = relay_scope();
    check_event_topics(scope, ids, "discard");
    const std::uint64_t discarded =
        discard_events(ids, scope.topics, scope.limited, GetCurrentTimestamp());
    finish_spi();
    PG_RETURN_INT64(static_cast<int64>(discarded));
}

// Gives back events the relay claimed and will not deliver in time: they
// are pending again at once and their attempt does not count. Events this
// transaction holds were never written as claimed, so forgetting the hold
// is all it takes.
Datum release_body(FunctionCallInfo fcinfo) {
    const Datum ids = ids_arg(fcinfo, 0, "ids");
    const text* relay = name_arg(fcinfo, 1, "relay");
    const Micros now = GetCurrentTimestamp();
    connect_spi();
    check_event_topics(relay_scope(), ids, "release");
    Datum* elements = nullptr;
    const int count = int8_elements(ids, &elements);
    Datum* others = static_cast<Datum*>(palloc(sizeof(Datum) * (count + 1)));
    int other_count = 0;
    std::uint64_t released = 0;
    for (int i = 0; i < count; ++i) {
        const text* holder = held_relay(DatumGetInt64(elements[i]));
        if (holder != nullptr && same_text(holder, relay)) {
            (void)settle_held(DatumGetInt64(elements[i]));
            count_held_event_released(DatumGetInt64(elements[i]));
            ++released;
        } else if (holder == nullptr) {
            others[other_count++] = elements[i];
        }
    }
    if (other_count > 0) released += release_events(int8_array(others, other_count), relay, now);
    finish_spi();
    PG_RETURN_INT64(static_cast<int64>(released));
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(outbox_enqueue, idem::pg::enqueue_body)
IDEM_SQL_FUNCTION(outbox_claim, idem::pg::claim_body)
IDEM_SQL_FUNCTION(outbox_ack, idem::pg::ack_body)
IDEM_SQL_FUNCTION(outbox_nack, idem::pg::nack_body)
IDEM_SQL_FUNCTION(outbox_redrive, idem::pg::redrive_body)
IDEM_SQL_FUNCTION(outbox_release, idem::pg::release_body)
IDEM_SQL_FUNCTION(outbox_discard, idem::pg::discard_body)
