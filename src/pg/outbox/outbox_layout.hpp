// Which layout of idempotency.outbox the installed version of the extension
// has. From 0.5.0 the outbox keeps a ready queue (docs/outbox.md): claims
// read only the heads of keys, and the order of a key's events is fixed
// when the enqueuing transaction commits. Before, claims walk the live
// queue in id order and producers of a key take turns for their whole
// transaction; the library keeps serving such a database until it is
// updated.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Whether the installed outbox has the ready queue. Needs a transaction.
bool outbox_has_ready_queue();

}  // namespace idem::pg
