// Whether the extension's tables in this database are the target of a
// logical replication subscription, as on the new side of an upgrade or a
// move by logical replication: their rows come from the publisher, whose
// workers expire, settle and purge them. Here the workers and
// idem_maintenance() change nothing (a purge of their own would insert the
// tombstone that the publisher's purge sends next, and stop the
// subscription on a duplicate key), and the views count from the tables
// (the subscription's writes do not go through the functions) until the
// subscription is dropped.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// The name (palloc'd) of a subscription that writes into one of the tables
// the workers change (keys, tombstones, outbox, inbox, locks), or nullptr
// when none does or the extension is not installed. Needs a transaction.
const char* feeding_subscription();

}  // namespace idem::pg
