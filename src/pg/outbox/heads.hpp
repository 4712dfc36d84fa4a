// The heads of the outbox's keys (ready-queue layout, 0.5.0). Each (topic,
// key) with live (pending or in-flight) events has exactly one head: the
// event with a ready_at, the only one of its key a claim may hand out. The
// others wait behind it without one, in their key's order: by key_seq, or
// their id when they have none.
//
// Who changes heads, and how they stay right without locks held across a
// caller's transaction. An enqueue, an ack or death of a head, and a
// redrive decide at once from what their statement sees (so that the same
// transaction sees the result), and record the key. In the step before the
// commit the transaction takes the turns of all the keys it recorded, in
// one pass in turn order (pg/outbox/producer_turn.hpp), and checks each key
// against the newest committed data: the turns are held until the commit
// ends, so of two transactions that touch one key, the second to commit
// sees what the first committed. Where a concurrent commit changed the
// picture, the check writes the difference, which is rare:
// - an enqueued event whose key had a later event committed meanwhile gets
//   a place after it (a new key_seq), so per-key order is commit order;
// - an enqueued event that took the head while another transaction's event
//   of its key committed first gives it up; one that waited behind a head
//   that was acked meanwhile takes it;
// - the next event after an ended head becomes the head.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// This transaction enqueued `id` for (topic, key); `head`: as its key's
// head, decided after reading `seen`, the key's turn count
// (pg/outbox/producer_turn.hpp).
void enqueued_keyed(const text* topic, const text* key, std::int64_t id, bool head,
                    std::uint64_t seen);

// The heads of these keys ended (acked or dead) at these places in their
// keys' order: the next event of each key becomes its head, in the step
// before the commit, or before a claim of the same transaction
// (promote_ended_heads) so that it sees them. Values are copied.
struct EndedHeads {
    const text** topics;
    const text** keys;
    std::int64_t* places;
    std::int64_t* ids;  // the ended events (0: not known), whose own entries
                        // the look for the next head passes over unread
    int count;
};
void heads_ended(const EndedHeads& ended, Micros now);
void promote_ended_heads(Micros now);

// This transaction redrove the dead keyed event `id`, at `place` in its
// key's order: it becomes its key's head, or waits behind the head its key
// has. Events of one key are redriven in id order.
void redriven_keyed(std::int64_t id, const text* topic, const text* key, std::int64_t place,
                    Micros now);

// Collects (topic, key, place) from columns `first`, `first + 1` and
// `first + 2` of the rows of SPI_tuptable whose key is not NULL.
EndedHeads ended_heads_in_result(int first);

void install_outbox_heads_callbacks();

}  // namespace idem::pg
