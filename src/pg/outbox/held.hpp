// The outbox events this transaction claimed and holds by their row lock
// alone. outbox_claim only locks the events it hands out; what a claim
// would write (in flight, one more attempt, the lease, the relay) is
// written when the transaction commits, unless the same transaction acked
// or nacked the event first: that write then carries the claim's changes
// with the final state. A relay that claims and acks in one transaction so
// writes each event once instead of twice, and other sessions see no
// difference: until the commit they see an event locked by a running
// transaction either way, and after it what the transaction ended with.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// One outbox_claim call: what it writes for the events it handed out.
struct ClaimWrite {
    const text* relay;
    Micros lease_until;
    Micros claimed_at;
    std::int32_t max_attempts;  // the claiming session's cap, recorded for the sweep
};

// Records that this transaction holds the events `ids` (locked by the
// current subtransaction) for the claim `write`, run as the current user;
// `versions`, when given, are the row versions it locked, and
// `followers`, when given, which events follow a head in its run (their
// claim gives them no ready_at: they stay behind their head).
void hold_events(const ClaimWrite& write, const std::int64_t* ids, const ItemPointerData* versions,
                 const bool* followers, int count);

// Whether this transaction holds any event that no ack or nack settled.
bool holds_any();
// The relay of a held event not yet settled, or nullptr.
const text* held_relay(std::int64_t id);
// Whether it holds event `id`, not settled yet.
bool holds(std::int64_t id);
// Settles event `id` if this transaction holds it: returns what its claim
// would have written (the caller writes the claim's changes with its own:
// the relay, the cap), or null when the event was not held. *version, when
// asked for, gets the row version the claim locked (invalid when not known).
const ClaimWrite* settle_held(std::int64_t id, ItemPointerData* version = nullptr);

// The held, unsettled events' ids as a bigint[] (empty when none).
Datum held_ids();

void install_outbox_held_callbacks();

}  // namespace idem::pg
