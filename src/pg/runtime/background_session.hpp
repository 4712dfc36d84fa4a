// The settings a background worker of the extension (a sweep, an outbox
// notifier) runs under. A database's and a role's defaults (ALTER DATABASE
// ... SET, ALTER ROLE ... SET) are meant for the applications' sessions, yet
// apply to a background worker's connection too. As PostgreSQL's autovacuum
// does for its own workers, the ones the extension's work is not written
// for are put back:
// - default_transaction_isolation: READ COMMITTED. The sweeps decide on each
//   row's newest version; under REPEATABLE READ a row that a holder changed
//   after a sweep's snapshot fails the sweep with 40001 (also behind SKIP
//   LOCKED), and under SERIALIZABLE the sweeps' reads would take part in the
//   applications' serialization checks.
// - lock_timeout: none. A lock the work waits for is one it needs; with a
//   timeout, the worker would fail and be started again, without end, for
//   as long as a transaction holds it.
// They are set at the override level, as autovacuum sets its own: a local
// setting of either in these processes would be ignored (as would the lock
// timeout of execute_in_subtransaction and wait_within, pg/access/spi.hpp),
// and none of their work asks for one.
// default_transaction_read_only is kept: it fences a database (as at a
// switchover, on the old primary), and the fence holds for the extension's
// writes too; a sweep of a fenced database waits (database_fence).
#pragma once

namespace idem::pg {

void use_background_session_settings();

// Why a sweep leaves the worker's database as it is: not at all; its
// connection's default_transaction_read_only is on; or a logical
// replication subscription writes into the extension's tables there
// (pg/access/subscription_target.hpp), whose publisher's workers do the
// work. Needs a transaction.
enum class Fence : char { None, ReadOnly, Subscribed };
Fence database_fence();

}  // namespace idem::pg
