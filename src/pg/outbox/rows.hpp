// The outbox's rows written directly on the table and its indexes
// (pg/access/row_access.hpp), no SPI: the hot writes of outbox_enqueue,
// outbox_ack and outbox_claim. Each write stands for the SQL statement it
// replaces and puts the same values in the same columns (those an INSERT
// leaves out get their defaults), fires the same triggers once per call,
// and keeps every index. A change of events by id is UPDATE ... WHERE id =
// ANY (ids) AND <its condition>: the rows in id order, each once; a row
// changed concurrently is waited for and, under READ COMMITTED, decided
// again on its newest version (under the stricter levels, 40001).
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/claim.hpp"
#include "pg/outbox/heads.hpp"
#include "pg/outbox/store.hpp"

namespace idem::pg {

// The event as the table got it (a trigger may have changed it).
struct InsertedEvent {
    std::int64_t id;
    bool head;  // it has a ready_at: its key's head (always without a key)
};

// Inserts `event` (without a dedup_key; ready-queue layout) under `id`, as
// INSERT ... OVERRIDING SYSTEM VALUE does: enqueued and changed `now`, due
// at its available_at, and in the ready queue from then (or now) when it
// is its key's `head`.
InsertedEvent insert_new_event(const NewEvent& event, Micros now, std::int64_t id, bool head);

// What a change of events by id changed (the rows RETURNING would give):
// the events that ended their keys' heads, and the topics of all of them,
// copied (ready-queue layout; nothing before it).
struct ChangedEvents {
    std::uint64_t count;
    EndedHeads ended;
    const text** topics;
    int topic_count;
};

// The claims not yet written of events this transaction holds, one element
// per id: the relay (text) and the cap (int4) each claim would write.
struct HeldClaims {
    const Datum* relays = nullptr;  // nullptr: the events are not held
    const Datum* caps = nullptr;
};

// Acks events: delivered `now`, their lease and ready place gone. With
// held claims the claim's changes go with it (one more attempt, the relay,
// the cap) for an event pending or in flight, and `versions` are the row
// versions the claims locked (each tried before the primary key; invalid:
// not known); without, an event is acked when in flight, or pending after
// an attempt (a late ack after its lease ran out: the event was delivered).
ChangedEvents ack_by_id(const Datum* ids, const HeldClaims& held, const ItemPointerData* versions,
                        int count, Micros now);

// The claims' writes of events pending or in flight: in flight, one more
// attempt, the claim's lease (and ready place: due again when it ends;
// a follower in a run has none, unless it became its key's head since),
// relay, time and attempt cap; each argument one per id (`followers` may
// be nullptr: none).
void write_claims_by_id(const Datum* ids, const Datum* lease_untils, const Datum* relays,
                        const Datum* claimed_ats, const Datum* max_attempts, const bool* followers,
                        int count);

// Where lock_due_events and lock_runs put what they hand out, one element
// per event: its id, the row version locked, and whether it follows a
// head in its run (not a head itself).
struct LockedEvents {
    std::int64_t* ids;
    ItemPointerData* versions;
    bool* followers;
};

// A keyed head handed out: its key and place in its key's order (copied),
// from where its run is looked for.
struct RunHead {
    const text* topic;
    const text* key;
    std::int64_t place;
    std::int64_t id;
};

// Locks up to `wanted` of the row versions `tids` (read from the outbox by
// this transaction, oldest ready first) whose events are still ready and
// due, in that order, passes each to `take` and records it in `out`;
// returns how many. As SELECT ... WHERE ctid = ANY (tids) AND ready_at <= now AND
// <pending, or in flight with attempts left> ORDER BY ready_at, id LIMIT
// wanted FOR NO KEY UPDATE SKIP LOCKED does: a version no longer visible
// is passed over, so is an event another transaction holds, and under
// READ COMMITTED an event changed since is decided on its newest version.
// When `heads` is given, the keyed ones are added to it (*head_count).
int lock_due_events(const ItemPointerData* tids, int count, int wanted, Micros now,
                    int max_attempts, HandedOut take, void* context, const LockedEvents& out,
                    RunHead* heads = nullptr, int* head_count = nullptr);

// The runs of `heads` (handed out by this claim, in that order), while
// `room` lasts: behind each, up to run_length - 1 events waiting in its
// key's order, consecutive, each due (pending and past its available_at,
// or in flight with a lease that ran out and attempts left) and free to
// lock; a run stops at the first that is not. Passes each to `take`,
// records it in `out` as a follower; returns how many.
int lock_runs(const RunHead* heads, int head_count, int room, int run_length, Micros now,
              int max_attempts, HandedOut take, void* context, const LockedEvents& out);

}  // namespace idem::pg
