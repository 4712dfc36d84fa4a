// The recount of a database's gauges (pg/stats/gauges.hpp) from its tables: the
// finished keys per scope and the undelivered and dead events per topic,
// read with one snapshot. Run by the background worker when the counts are
// unknown (after a server start, an update, idempotency.request_sweep()),
// by idem_maintenance(), and by a view's read when no worker would come.
// Only from 0.6.0, whose views read the counts. Callers hold SPI.
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/stats/gauges.hpp"

namespace idem::pg {

// Whether the installed version's views read the gauges.
bool gauges_apply();

// Recounts when the counts are unknown; true when they are known after
// (kept, or counted from the tables at each read).
// With `repair`, first gives the live keys written other than through the
// functions (a restore, a manual INSERT) the active_since they lack, so
// that the sweeps find them (it writes: not in a read-only transaction).
bool recount_if_unknown(bool repair);

// For a view's read: where the counts come from, recounting at once when
// they are unknown and the tables are small or no background worker would
// do it, and asking for one otherwise (Unknown meanwhile, and on a standby).
GaugeSource counts_for_view();

}  // namespace idem::pg
