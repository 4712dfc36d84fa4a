// The module's entry: the magic block and _PG_init.
#include "pg/access/statement_guard.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/heads.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/notifier_table.hpp"
#include "pg/outbox/notify.hpp"
#include "pg/outbox/producer_turn.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/runtime/launcher.hpp"
#include "pg/runtime/shared_memory.hpp"
#include "pg/stats/gauges.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/waiting/wakeup.hpp"

extern "C" {
IDEM_MODULE_MAGIC;
PGDLLEXPORT void _PG_init(void);
}

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
    idem::pg::install_shared_state_hooks();
    idem::pg::register_launcher();
}
