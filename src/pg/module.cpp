// The module's entry: the magic block, _PG_init, and the tables through
// which the runtime (src/pg/runtime) reaches the wings' parts without
// including them: the parts of the shared memory, the housekeeping's
// tasks, and the notifiers the launcher starts.
#include <iterator>

#include "pg/access/statement_guard.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/inbox/inbox.hpp"
#include "pg/keys/key_store.hpp"
#include "pg/keys/tombstone_store.hpp"
#include "pg/locks/locks.hpp"
#include "pg/outbox/heads.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/notifier_table.hpp"
#include "pg/outbox/notify.hpp"
#include "pg/outbox/prepared_topics.hpp"
#include "pg/outbox/producer_turn.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/outbox/tasks.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/runtime/launcher.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/runtime/tasks.hpp"
#include "pg/stats/counters.hpp"
#include "pg/stats/durations.hpp"
#include "pg/stats/gauges.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/stats/recount.hpp"
#include "pg/waiting/prepared_wakeups.hpp"
#include "pg/waiting/waiter_table.hpp"
#include "pg/waiting/wakeup.hpp"

extern "C" {
IDEM_MODULE_MAGIC;
PGDLLEXPORT void _PG_init(void);
}

namespace idem::pg {

// The shared memory's parts, and what guards each:
//   the counters        atomics; stats_reset: a spinlock held only to copy
//                       it (stats/counters.hpp).
//   the due table       per database, what is due and when: its LWLock
//                       (runtime/due_table.hpp).
//   the notifier table  per database, the topics waiting for the outbox
//                       notifier: its LWLock (outbox/notifier_table.hpp).
//   the ready floor     the outbox's oldest possibly uncommitted id: a
//                       spinlock (outbox/ready_floor.hpp).
//   producer turns      commit counts per turn: atomics
//                       (outbox/producer_turn.hpp).
//   the gauges          per database and scope or topic, the views'
//                       counts: their LWLock (stats/gauges.hpp).
//   the durations       per database and scope, how long completions
//                       took: an LWLock for the table, a spinlock per entry
//                       (stats/durations.hpp).
//   the waiter table    the sessions waiting for a key or a lock, by hash:
//                       a spinlock per bucket; each session's wake-up an
//                       atomic (waiting/waiter_table.hpp).
//   prepared wake-ups   what prepared transactions' commits are to wake:
//                       their LWLock (waiting/prepared_wakeups.hpp).
//   prepared topics     what prepared transactions' commits are to notify:
//                       their LWLock (outbox/prepared_topics.hpp).
const SharedMemoryPart kSharedMemoryParts[] = {
    {counters_size, nullptr, init_counters},
    {due_table_size, request_due_table_lock, init_due_table},
    {notifier_table_size, request_notifier_table_lock, init_notifier_table},
    {ready_floor_size, nullptr, init_ready_floor},
    {producer_turn_size, nullptr, init_producer_turns},
    {gauges_size, request_gauges_lock, init_gauges},
    {durations_size, request_durations_lock, init_durations},
    {waiter_table_size, nullptr, init_waiter_table},
    {prepared_wakeups_size, request_prepared_wakeups_lock, init_prepared_wakeups},
    {prepared_topics_size, request_prepared_topics_lock, init_prepared_topics},
};
const int kSharedMemoryPartCount = static_cast<int>(std::size(kSharedMemoryParts));

namespace {

// The housekeeping's tasks, in the order a sweep runs them.
constexpr MaintenanceTask kTasks[] = {
    {"expire_leases", "idempotency_keys", nullptr, TaskKind::Lease, expire_key_leases},
    {"expire_disconnected", "idempotency_keys", nullptr, TaskKind::Lease, expire_disconnected_keys},
    {"settle_leases", "idempotency_keys", "purge_at", TaskKind::Lease, settle_key_leases},
    {"expire_outbox_leases", "outbox", nullptr, TaskKind::Lease, expire_outbox_leases},
    // A purged key leaves its tombstone.
    {"purge_keys", "idempotency_keys", nullptr, TaskKind::Retention, purge_keys, "key_tombstones"},
    {"purge_tombstones", "key_tombstones", nullptr, TaskKind::Retention, purge_tombstones},
    {"purge_outbox", "outbox", nullptr, TaskKind::Retention, purge_outbox},
    {"purge_inbox", "inbox", nullptr, TaskKind::Retention, purge_inbox},
    {"purge_locks", "locks", nullptr, TaskKind::Retention, purge_locks},
};

}  // namespace

const BackgroundWork kBackgroundWork = {kTasks, static_cast<int>(std::size(kTasks)),
                                        recount_if_unknown, forget_gauges};

const NotifierDemand kNotifierDemand = {set_launcher_latch, wanted_notifiers,
                                        forget_notifier_slot};

}  // namespace idem::pg

// Nothing here allocates C++ objects or throws.
extern "C" void _PG_init(void) {
    // pg_upgrade loads the library to restore the schema: no settings,
    // hooks, shared memory or workers then.
    if (IsBinaryUpgrade) return;
    idem::pg::settings::define();
    idem::pg::install_statement_guard();
    idem::pg::install_selftest_callbacks();
    // Called after the others: what they write before the commit counts.
    idem::pg::install_ready_floor_callbacks();
    idem::pg::install_metrics_callbacks();
    idem::pg::install_gauge_callbacks();
    idem::pg::install_wakeup_callbacks();
    idem::pg::install_outbox_notify_callbacks();
    // The keys' heads are checked once the claims are written.
    idem::pg::install_outbox_heads_callbacks();
    // Last: PostgreSQL calls the newest callback first, and the claims it
    // writes before the commit must precede every other callback's work.
    idem::pg::install_outbox_held_callbacks();
    // Shared memory and the workers need the library to be preloaded.
    if (!process_shared_preload_libraries_in_progress) return;
    idem::pg::install_shared_memory_hooks();
    idem::pg::install_prepared_wakeups();
    idem::pg::install_prepared_topics();
    idem::pg::register_launcher();
}
