// Which layout of idempotency.outbox the installed version of the extension
// has, and where its columns are: the one place that names the columns the
// module reads and writes directly. From 0.5.0 the outbox keeps a ready
// queue (docs/outbox.md): claims read only the heads of keys, and the order
// of a key's events is fixed when the enqueuing transaction commits.
// Before, claims walk the live queue in id order and producers of a key
// take turns for their whole transaction; the library keeps serving such a
// database until it is updated.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Whether the installed outbox has the ready queue. Needs a transaction.
bool outbox_has_ready_queue();

// The columns of the outbox table `outbox` (open; 0: a column the
// installed version has not got) and the values of its state type, found
// once per layout of the table. A new column is added here, and to the
// direct writes that set it (pg/outbox/rows.hpp).
struct OutboxColumns {
    AttrNumber id, topic, key, payload, headers, dedup_key, state, attempts, enqueued_at,
        available_at, lease_until, relay, last_error, delivered_at, updated_at, max_attempts,
        ready_at, key_seq;
    Datum pending, in_flight, delivered, dead;
};
const OutboxColumns& outbox_columns(Relation outbox);

}  // namespace idem::pg
