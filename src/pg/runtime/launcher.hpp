// The background workers (library preloaded only): a launcher that finds
// the databases with the extension, and short-lived per-database workers
// that each run one sweep of the maintenance tasks and exit (as autovacuum
// workers do), so that no worker stays connected to a database that is
// being dropped.
#pragma once

namespace idem::pg {

// Registers the launcher; called from _PG_init while preloading.
void register_launcher();

}  // namespace idem::pg
