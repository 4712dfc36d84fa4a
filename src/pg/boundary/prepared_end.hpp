// What a prepared transaction's commit does late. A commit wakes the
// sessions waiting for what it changed and tells the relays of the events
// it enqueued; a prepared transaction commits at COMMIT PREPARED, later and
// in whichever session. Each part that acts at a commit parks what it would
// do at PREPARE TRANSACTION, in shared memory (library preloaded), and
// registers here a function that finds the prepared transactions that have
// ended and does it for the committed ones. A ProcessUtility hook, chained
// with any other, calls those functions after each COMMIT PREPARED and
// ROLLBACK PREPARED, still in that statement's own transaction: the ended
// transaction's outcome is visible, and a NOTIFY sent then is delivered
// when the statement's transaction commits.
#pragma once

namespace idem::pg {

// From _PG_init while preloading; at most kPreparedEndCallbacks in all.
inline constexpr int kPreparedEndCallbacks = 4;
void after_prepared_ends(void (*callback)());

}  // namespace idem::pg
