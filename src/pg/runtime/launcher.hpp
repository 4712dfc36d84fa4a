// The background workers (library preloaded only): a launcher that finds
// the databases with the extension, and short-lived per-database workers
// that each run one sweep of the maintenance tasks and exit (as autovacuum
// workers do), so that no worker stays connected to a database that is
// being dropped.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Databases with an outbox notifier at once: the slots of the notifier
// table (outbox/notifier_table.hpp).
inline constexpr int kNotifierSlots = 32;

// What the launcher asks of the notifier table, which committing backends
// fill when they want a database's notifier; defined by the module.
struct NotifierDemand {
    void (*set_launcher_latch)(Latch* latch);
    // For each slot, the database whose notifier is wanted and not
    // attached, or InvalidOid.
    void (*wanted)(Oid databases[kNotifierSlots]);
    // The database is gone: frees its slot.
    void (*forget)(int slot, Oid database);
};
extern const NotifierDemand kNotifierDemand;

// Registers the launcher; called from _PG_init while preloading.
void register_launcher();

}  // namespace idem::pg
