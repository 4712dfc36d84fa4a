// The outbox's rows written directly on the table and its indexes
// (pg/boundary/row_access.hpp), no SPI: the hot write of outbox_enqueue.
// Each write stands for the SQL statement it replaces and puts the same
// values in the same columns (those an INSERT leaves out get their
// defaults), fires the same triggers once per call, and keeps every index.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/outbox_store.hpp"

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

}  // namespace idem::pg
