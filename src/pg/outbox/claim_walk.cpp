#include "pg/outbox/claim_walk.hpp"

#include <algorithm>

#include "pg/access/spi.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/holders.hpp"
#include "pg/outbox/key_set.hpp"

extern "C" {
#include "storage/itemptr.h"
#include "storage/procarray.h"
#include "utils/array.h"
#include "utils/memutils.h"
}

// The claim of an outbox without the ready queue (before 0.5.0), kept
// while such a database is not updated.
//
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
// heads and unkeyed events that are due, and not held by a running
// transaction (another relay's claim, a nack), are then locked by row
// version, SKIP LOCKED, in id order and no more than the batch still needs,
// and handed out in the same statement; the lock is all a claim takes until
// its transaction commits (held.hpp). Events this transaction holds
// from an earlier claim count as in flight. Only the ones that ever failed
// are checked for a later event of their pair in flight (after a redrive).
// Windows grow until the batch is full or the queue ends, so thousands of
// events blocked behind a hot key or held by other relays delay a claim but
// never starve the events after them.
//
// Why one snapshot. Producers of a pair take turns (producer_turn.hpp), so
// a visible event implies that every earlier event of its pair is visible in
// the same snapshot. Reading later windows with a newer snapshot could show
// event n+1 of a pair whose event n committed after the earlier window was
// read, and hand n+1 out first.
//
// Between the walk's snapshot and the lock, other relays may have changed
// an event: the lock rechecks that it is still due, and an event the walk
// saw as live keeps blocking its pair for this claim, which errs on the
// side of waiting.

namespace idem::pg {

namespace {

#define OUTBOX " @outbox@ "
// An expired in-flight event is due while it has attempts left, by the cap
// its claim recorded (from 0.4.0) or the caller's.
#define IS_DUE(now, max_attempts)                                                    \
    " CASE WHEN state = 'pending' THEN available_at <= " now                        \
    "      ELSE lease_until <= " now " AND attempts < "                             \
    "@if outbox.max_attempts@COALESCE(max_attempts, " max_attempts ")@else@" max_attempts "@end@ END "

// Every live event of the claimed topics in id order (outbox_live), with
// the transaction that last locked or changed the row version read (xmax)
// and where that version is (ctid).
Statement kWalkLive = {
    "SELECT id, topic, key, state = 'in_flight', " IS_DUE("$1", "$2") ", xmax, ctid FROM" OUTBOX
    "WHERE state IN ('pending', 'in_flight') "
    "AND ($3::pg_catalog.text[] IS NULL OR topic = ANY ($3)) ORDER BY id",
    3, {TIMESTAMPTZOID, INT4OID, TEXTARRAYOID}, nullptr};

// Locks up to $4 of the candidates, in id order, that are still due, and
// hands them out. The candidates are the row versions the walk read, found
// by ctid without an index descent. A version changed since the walk is
// passed over this time (a change while the statement runs is followed to
// the newest version, which the lock rechecks): such rows wait for the next
// claim. Only an event that ever failed (and so may have been dead and
// redriven) or is in flight is checked for another event of its pair in
// flight, or held by this transaction ($5): an event pending since it
// committed has blocked every later event of its pair all along, as
// producers take turns (producer_turn.hpp). The claim itself is written at
// commit (held.hpp). The last column: whether the event was in
// flight with an expired lease.
Statement kHandOut = {
    "SELECT o.id, o.topic, o.key, o.payload, o.headers, o.dedup_key, o.attempts + 1,"
    "       o.enqueued_at, o.state = 'in_flight' FROM" OUTBOX "o"
    " WHERE o.ctid = ANY ($1) AND o.state IN ('pending', 'in_flight') AND " IS_DUE("$2", "$3")
    "   AND (o.key IS NULL OR (o.state = 'pending' AND o.last_error IS NULL) OR ("
    "        NOT EXISTS (SELECT 1 FROM" OUTBOX "f WHERE f.topic = o.topic AND f.key = o.key"
    "                       AND f.id <> o.id AND f.state = 'in_flight')"
    "    AND NOT EXISTS (SELECT 1 FROM" OUTBOX "f WHERE f.id = ANY ($5) AND f.topic = o.topic"
    "                       AND f.key = o.key AND f.id <> o.id)))"
    " ORDER BY o.id LIMIT $4 FOR NO KEY UPDATE OF o SKIP LOCKED",
    5, {TIDARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID, INT8ARRAYOID}, nullptr};

// Rows read per window. The first window is sized by what the backend's
// last full claim walked per event handed out (other relays' events and
// events waiting behind their heads come before a batch); later windows
// double, up to a bound on memory per window.
constexpr long kMaxWindow = 8192;
constexpr double kFirstWalkPerEvent = 1.5;
double walked_per_event = kFirstWalkPerEvent;  // this backend's last full claim

long first_window(int batch) {
    const double rows = batch * walked_per_event * 1.1 + 16;
    return std::min<long>(kMaxWindow, static_cast<long>(rows));
}


// Whether the walked row `row` may be handed out, as far as the live events
// before it tell; records its pair.
bool is_candidate(OutboxKeySet keys, Holders* holders, std::uint64_t row) {
    bool isnull = false;
    // Held by this transaction: handed out by an earlier claim, its claim
    // not yet written. It is in flight as far as its pair is concerned.
    const bool mine = holds_any() && holds(DatumGetInt64(column(1, &isnull, row)));
    const bool in_flight = mine || DatumGetBool(column(4, &isnull, row));
    const bool due = !mine && DatumGetBool(column(5, &isnull, row));
    const bool held =
        due && held_by_other(holders, DatumGetTransactionId(column(6, &isnull, row)));
    bool no_key = false;
    const Datum key = column(3, &no_key, row);
    if (no_key) return due && !held;  // no key, no order
    const Datum topic = column(2, &isnull, row);
    bool first = false;
    KeySighting* pair = meet_key(keys, DatumGetTextPP(topic), DatumGetTextPP(key), &first);
    const bool earlier_in_flight = in_flight_seen(pair);
    if (in_flight) mark_in_flight(pair);
    if (held) return false;  // its pair's later events wait behind it all the same
    if (first) return due;
    // Behind its pair's head: only an expired in-flight event (the head was
    // redriven), and never a second one in flight.
    return due && in_flight && !earlier_in_flight;
}

// Hands out up to `wanted` of the candidates (row versions) with kHandOut,
// passes them to `sink`, records the claims to write at commit
// (held.hpp); returns how many, and in *last the greatest id handed
// out.
std::uint64_t hand_out(const ClaimRequest& request, Micros now, Datum* versions, int count,
                       int wanted, HandedOut sink, void* context, Datum* last) {
    Params params;
    params.add(PointerGetDatum(construct_array(versions, count, TIDOID, sizeof(ItemPointerData),
                                               false, TYPALIGN_SHORT)));
    params.add_timestamp(now).add_int4(request.max_attempts).add_int4(wanted);
    params.add(held_ids());
    const std::uint64_t handed = execute(kHandOut, params);
    if (handed > 0) {
        auto* ids = static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * handed));
        bool isnull = false;
        for (std::uint64_t row = 0; row < handed; ++row) {
            HandedOutEvent event;
            for (int i = 0; i < HandedOutEvent::kColumns; ++i)
                event.values[i] = column(i + 1, &event.nulls[i], row);
            event.lease_ran_out =
                DatumGetBool(column(HandedOutEvent::kColumns + 1, &isnull, row));
            sink(event, context);
            ids[row] = DatumGetInt64(event.values[0]);
        }
        hold_events(ClaimWrite{request.relay, request.lease_until, now, request.max_attempts}, ids,
                    nullptr, nullptr, static_cast<int>(handed));
        if (last != nullptr) *last = column(1, &isnull, handed - 1);
    }
    SPI_freetuptable(SPI_tuptable);
    return handed;
}

}  // namespace

std::uint64_t claim_by_walking(const ClaimRequest& request, Micros now, HandedOut sink,
                               void* context) {
    MemoryContext const caller_memory = CurrentMemoryContext;
    MemoryContext const claim_memory =
        AllocSetContextCreate(caller_memory, "idempotency outbox claim", ALLOCSET_DEFAULT_SIZES);
    MemoryContext const window_memory = AllocSetContextCreate(
        claim_memory, "idempotency outbox claim window", ALLOCSET_DEFAULT_SIZES);
    const OutboxKeySet keys = make_key_set(claim_memory);
    const std::uint64_t batch = static_cast<std::uint64_t>(request.batch);

    Params walk_params;
    walk_params.add_timestamp(now).add_int4(request.max_attempts);
    walk_params.add_datum(request.topics.topics, request.topics.limited);
    Portal walk = open_cursor(kWalkLive, walk_params);
    std::uint64_t handed = 0;
    std::uint64_t walked = 0;
    Holders holders;
    for (long window = first_window(request.batch);; window = std::min(window * 2, kMaxWindow)) {
        MemoryContextReset(window_memory);
        const std::uint64_t rows = fetch(walk, window);
        MemoryContextSwitchTo(window_memory);
        // The candidates: their ids, row versions and how far the walk was.
        Datum* candidates = static_cast<Datum*>(palloc(sizeof(Datum) * (rows + 1)));
        Datum* versions = static_cast<Datum*>(palloc(sizeof(Datum) * (rows + 1)));
        auto* tids = static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * (rows + 1)));
        auto* walked_to = static_cast<std::uint64_t*>(palloc(sizeof(std::uint64_t) * (rows + 1)));
        int count = 0;
        for (std::uint64_t row = 0; row < rows; ++row) {
            if (!is_candidate(keys, &holders, row)) continue;
            bool isnull = false;
            candidates[count] = Int64GetDatum(DatumGetInt64(column(1, &isnull, row)));
            ItemPointerCopy(reinterpret_cast<ItemPointer>(DatumGetPointer(column(7, &isnull, row))),
                            &tids[count]);
            versions[count] = PointerGetDatum(&tids[count]);
            walked_to[count++] = walked + row + 1;
        }
        walked += rows;
        SPI_freetuptable(SPI_tuptable);
        Datum last = 0;
        if (count > 0) {
            handed += hand_out(request, now, versions, count, static_cast<int>(batch - handed),
                               sink, context, &last);
        }
        if (handed == batch) {
            // How far the walk had to go: to the last event handed out.
            const Datum* at = std::lower_bound(
                candidates, candidates + count, last,
                [](Datum a, Datum b) { return DatumGetInt64(a) < DatumGetInt64(b); });
            walked_per_event = std::max(1.0, static_cast<double>(walked_to[at - candidates]) /
                                                 static_cast<double>(batch));
            break;
        }
        if (rows < static_cast<std::uint64_t>(window)) break;  // walked the whole queue
    }
    close_cursor(walk);
    MemoryContextSwitchTo(caller_memory);
    MemoryContextDelete(claim_memory);
    return handed;
}

}  // namespace idem::pg
