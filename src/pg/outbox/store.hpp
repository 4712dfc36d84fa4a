// Where the transactional outbox is changed: every statement that reads or
// changes idempotency.outbox, except the claim's (claim.hpp), and
// the writes done directly on the table instead (rows.hpp). Callers
// hold an SPI connection, except for those direct writes: insert_event, the
// acks and write_claims.
#pragma once

#include <cstdint>
#include <optional>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct ClaimWrite;  // pg/outbox/held.hpp

struct NewEvent {
    text* topic;
    Datum payload;
    text* key;        // may be null
    Datum headers;    // jsonb, when has_headers
    bool has_headers;
    text* dedup_key;  // may be null
    Micros available_at;
};

// Inserts the event (directly on the table in the ready-queue layout when
// it has no dedup_key); with a dedup_key already taken by (topic,
// dedup_key), inserts nothing and returns the existing event's id.
// *inserted tells which.
std::int64_t insert_event(const NewEvent& event, Micros now, bool* inserted);

// Acks the events of `ids` (count of them) that are in flight, or pending
// after an attempt; returns how many.
std::uint64_t ack_events(const Datum* ids, int count, Micros now);

// Events this transaction claims and has not yet written (held.hpp):
// parallel arrays, one element per event.
struct ClaimedEvents {
    const Datum* ids;           // bigint
    const Datum* lease_untils;  // timestamptz
    const Datum* relays;        // text
    const Datum* claimed_ats;   // timestamptz
    const Datum* max_attempts;  // int4
    const bool* followers;      // following a head in its run (nullptr: none)
    int count;
};
// Writes the claims: in flight, one more attempt, the lease and the relay;
// a head's ready place moves to the end of its lease, a follower keeps
// none (unless the end of the head before it made it one meanwhile).
void write_claims(const ClaimedEvents& events);
// Acks held events (ids, with the relay that claimed each, its claim's cap
// and the row version it locked), writing their claims with the delivery.
std::uint64_t ack_held_events(const Datum* ids, const Datum* relays, const Datum* caps,
                              const ItemPointerData* versions, int count, Micros now);

struct EventState {
    Datum state;  // outbox_state enum value
    Oid state_type;
    const char* label;
    std::int32_t attempts;
    std::optional<std::int32_t> max_attempts;  // the cap its claim recorded
};
// Locks the event's row; false when it does not exist.
bool lock_event(std::int64_t id, EventState* out);
// What a nack writes: pending (due at available_at) or dead, with the
// error and the attempts; a nack of a held event also writes its claim's
// relay and cap (null otherwise, which keeps them).
struct Failure {
    bool dead;
    const text* error;
    Micros available_at;
    std::int32_t attempts;
    const ClaimWrite* held_claim;
};
void retry_or_bury(std::int64_t id, const Failure& failure, Micros now);

// Dead events (of `ids`, `topic`, and `topics` when has_topics) back to pending.
std::uint64_t redrive_events(Datum ids, bool has_ids, const text* topic, Micros now,
                             Datum topics, bool has_topics);

// Deletes the dead events of `ids` (of `topics` when has_topics): an
// operator gives up on them, and the next event of each key they held back
// becomes its head. Returns how many.
std::uint64_t discard_events(Datum ids, Datum topics, bool has_topics, Micros now);

// In-flight events of `ids` that `relay` claimed back to pending, their
// attempt given back; returns how many.
std::uint64_t release_events(Datum ids, const text* relay, Micros now);

// A value of the installed extension's outbox_state.
Datum outbox_state_value(const char* label);

// Maintenance batches.
// In-flight events whose lease ran out go back to pending, or to dead when
// their attempts are used up, by the cap their claim recorded or else
// `max_attempts` (*dead counts those).
std::uint64_t expire_event_leases(int batch, int max_attempts, Micros now, std::uint64_t* dead);
std::uint64_t purge_delivered_events(int batch, Micros cutoff);

}  // namespace idem::pg
