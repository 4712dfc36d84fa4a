#include "pg/outbox_claim.hpp"

#include <algorithm>

#include "pg/outbox_key_set.hpp"
#include "pg/spi.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/memutils.h"
}

// What a claim may hand out. An event is due when it is pending and its
// time has come, or in flight with a lease that ran out and attempts left
// (maintenance buries the rest). A keyed event is handed out only when it is
// its (topic, key)'s head, the first live (pending or in-flight) event of
// the pair in id order, and no other event of the pair is in flight. The one
// exception: an expired in-flight event is the pair's one in flight and is
// handed out again even when an earlier event of its pair was redriven
// meanwhile (that one waits behind it), or the pair would be stuck until
// maintenance. A dead or delivered event is not live and blocks nothing.
//
// How it is found. One cursor walks the live events of the claimed topics
// in id order, all read with one snapshot, a window at a time. Walking from
// the queue's start, the claim meets every live event before the one it
// reads: the first time it meets a pair is that pair's head, so per-key
// order costs a hash lookup instead of an index probe per candidate. The
// heads and unkeyed events that are due are then locked, SKIP LOCKED, in id
// order and no more than the batch still needs: events other relays hold are
// passed over without further work. Only the locked ones are checked for a
// later event of their pair in flight (after a redrive), in the UPDATE that
// hands them out. Windows grow until the batch is full or the queue ends, so
// thousands of events blocked behind a hot key or held by other relays
// delay a claim but never starve the events after them.
//
// Why one snapshot. Producers of a pair take turns (producer_turn.hpp), so
// a visible event implies that every earlier event of its pair is visible in
// the same snapshot. Reading later windows with a newer snapshot could show
// event n+1 of a pair whose event n committed after the earlier window was
// read, and hand n+1 out first.
//
// Between the walk's snapshot and the lock, other relays may have changed
// an event: the lock rechecks that it is still due (on its newest version),
// and an event the walk saw as live keeps blocking its pair for this claim,
// which errs on the side of waiting.

namespace idem::pg {

namespace {

#define OUTBOX " idempotency.outbox "
#define IS_DUE(now, max_attempts)                                                    \
    " CASE WHEN state = 'pending' THEN available_at <= " now                        \
    "      ELSE lease_until <= " now " AND attempts < " max_attempts " END "

// Every live event of the claimed topics in id order (outbox_live).
Statement kWalkLive = {
    "SELECT id, topic, key, state = 'in_flight', " IS_DUE("$1", "$2") "FROM" OUTBOX
    "WHERE state IN ('pending', 'in_flight') "
    "AND ($3::pg_catalog.text[] IS NULL OR topic = ANY ($3)) ORDER BY id",
    3, {TIMESTAMPTZOID, INT4OID, TEXTARRAYOID}, nullptr};

// Locks up to $4 of the candidates, in id order, that are still due.
Statement kLockCandidates = {
    "SELECT id, state = 'in_flight' FROM" OUTBOX
    "WHERE id = ANY ($1) AND state IN ('pending', 'in_flight') AND " IS_DUE("$2", "$3")
    "ORDER BY id LIMIT $4 FOR NO KEY UPDATE SKIP LOCKED",
    4, {INT8ARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID}, nullptr};

// Hands out the locked events, but none whose pair has another event in
// flight (the pair's head redriven behind it). $5: the ids that were in
// flight with an expired lease.
Statement kHandOut = {
    "WITH handed AS ("
    "  UPDATE" OUTBOX "o SET state = 'in_flight', attempts = o.attempts + 1, lease_until = $2,"
    "         relay = $3, updated_at = $4"
    "   WHERE o.id = ANY ($1)"
    "     AND (o.key IS NULL OR NOT EXISTS ("
    "          SELECT 1 FROM" OUTBOX "f WHERE f.topic = o.topic AND f.key = o.key"
    "             AND f.id <> o.id AND f.state = 'in_flight'))"
    "  RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts,"
    "            o.enqueued_at, o.id = ANY ($5))"
    " SELECT * FROM handed ORDER BY id",
    5, {INT8ARRAYOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, INT8ARRAYOID}, nullptr};

// Rows read per window: the first covers a batch and the events usually met
// before it; later ones double, up to a bound on memory per window.
constexpr long kMaxWindow = 8192;

long first_window(int batch) { return std::min<long>(kMaxWindow, 2L * batch + 16); }

// One claim's progress. Trivially destructible; its arrays live in `memory`.
struct Claim {
    const ClaimRequest* request;
    Micros now;
    HandedOut sink;
    void* context;
    Datum* locked;  // ids locked and not yet handed out
    int locked_count;
    Datum* expired;  // those of them whose lease had run out
    int expired_count;
    std::uint64_t handed;
};

Datum int8_array(const Datum* ids, int count) {
    return PointerGetDatum(construct_array(const_cast<Datum*>(ids), count, INT8OID,
                                           sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

// Whether the walked row `row` may be handed out, as far as the live events
// before it tell; records its pair.
bool is_candidate(OutboxKeySet keys, std::uint64_t row) {
    bool isnull = false;
    const bool in_flight = DatumGetBool(column(4, &isnull, row));
    const bool due = DatumGetBool(column(5, &isnull, row));
    const Datum key = column(3, &isnull, row);
    if (isnull) return due;  // no key, no order
    const Datum topic = column(2, &isnull, row);
    bool first = false;
    KeySighting* pair = meet_key(keys, DatumGetTextPP(topic), DatumGetTextPP(key), &first);
    const bool earlier_in_flight = in_flight_seen(pair);
    if (in_flight) mark_in_flight(pair);
    if (first) return due;
    // Behind its pair's head: only an expired in-flight event (the head was
    // redriven), and never a second one in flight.
    return due && in_flight && !earlier_in_flight;
}

void lock_candidates(Claim* claim, const Datum* ids, int count) {
    const int wanted = claim->request->batch - static_cast<int>(claim->handed) - claim->locked_count;
    Params params;
    params.add(int8_array(ids, count)).add_timestamp(claim->now);
    params.add_int4(claim->request->max_attempts).add_int4(wanted);
    const std::uint64_t locked = execute(kLockCandidates, params);
    for (std::uint64_t row = 0; row < locked; ++row) {
        bool isnull = false;
        const Datum id = Int64GetDatum(DatumGetInt64(column(1, &isnull, row)));
        claim->locked[claim->locked_count++] = id;
        if (DatumGetBool(column(2, &isnull, row))) claim->expired[claim->expired_count++] = id;
    }
    SPI_freetuptable(SPI_tuptable);
}

void hand_out(Claim* claim) {
    Params params;
    params.add(int8_array(claim->locked, claim->locked_count));
    params.add_timestamp(claim->request->lease_until).add_text(claim->request->relay);
    params.add_timestamp(claim->now).add(int8_array(claim->expired, claim->expired_count));
    const std::uint64_t handed = execute(kHandOut, params);
    if (handed > 0) claim->sink(handed, claim->context);
    SPI_freetuptable(SPI_tuptable);
    claim->handed += handed;
    claim->locked_count = 0;
    claim->expired_count = 0;
}

}  // namespace

std::uint64_t claim_events(const ClaimRequest& request, Micros now, HandedOut sink,
                           void* context) {
    MemoryContext const caller_memory = CurrentMemoryContext;
    MemoryContext const claim_memory =
        AllocSetContextCreate(caller_memory, "idempotency outbox claim", ALLOCSET_DEFAULT_SIZES);
    MemoryContext const window_memory =
        AllocSetContextCreate(claim_memory, "idempotency outbox claim window",
                              ALLOCSET_DEFAULT_SIZES);
    Claim claim;
    claim.request = &request;
    claim.now = now;
    claim.sink = sink;
    claim.context = context;
    claim.locked = static_cast<Datum*>(MemoryContextAlloc(claim_memory, sizeof(Datum) * request.batch));
    claim.locked_count = 0;
    claim.expired =
        static_cast<Datum*>(MemoryContextAlloc(claim_memory, sizeof(Datum) * request.batch));
    claim.expired_count = 0;
    claim.handed = 0;
    const OutboxKeySet keys = make_key_set(claim_memory);

    Params walk_params;
    walk_params.add_timestamp(now).add_int4(request.max_attempts);
    walk_params.add_datum(request.topics, request.has_topics);
    Portal walk = open_cursor(kWalkLive, walk_params);
    for (long window = first_window(request.batch);; window = std::min(window * 2, kMaxWindow)) {
        MemoryContextReset(window_memory);
        const std::uint64_t rows = fetch(walk, window);
        MemoryContextSwitchTo(window_memory);
        Datum* candidates = static_cast<Datum*>(palloc(sizeof(Datum) * (rows + 1)));
        int count = 0;
        for (std::uint64_t row = 0; row < rows; ++row) {
            if (!is_candidate(keys, row)) continue;
            bool isnull = false;
            candidates[count++] = Int64GetDatum(DatumGetInt64(column(1, &isnull, row)));
        }
        SPI_freetuptable(SPI_tuptable);
        if (count > 0) lock_candidates(&claim, candidates, count);
        const bool walked_all = rows < static_cast<std::uint64_t>(window);
        const bool batch_locked =
            claim.handed + static_cast<std::uint64_t>(claim.locked_count) ==
            static_cast<std::uint64_t>(request.batch);
        // A locked event may still be refused (a later one of its pair in
        // flight): then the walk goes on.
        if (claim.locked_count > 0 && (walked_all || batch_locked)) {
            MemoryContextSwitchTo(window_memory);
            hand_out(&claim);
        }
        if (walked_all || claim.handed == static_cast<std::uint64_t>(request.batch)) break;
    }
    close_cursor(walk);
    MemoryContextSwitchTo(caller_memory);
    MemoryContextDelete(claim_memory);
    return claim.handed;
}

}  // namespace idem::pg
