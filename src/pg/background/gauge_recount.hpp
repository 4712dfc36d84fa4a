// The recount of a database's gauges (pg/shmem/gauges.hpp) from its tables: the
// finished keys per scope and the undelivered and dead events per topic,
// read with one snapshot. Run by the background worker when the counts are
// unknown (after a server start, an update, idempotency.request_sweep()),
// by idem_maintenance(), and by a view's read when no worker would come.
// Only from 0.6.0, whose views read the counts. Callers hold SPI.
#pragma once

#include "pg/shmem/gauges.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Whether the installed version's views read the gauges.
bool gauges_apply();

// Recounts when the counts are unknown; true when they are known after.
// With `repair`, first gives the live keys written other than through the
// functions (a restore, a manual INSERT) the active_since they lack, so
// that the sweeps find them (it writes: not in a read-only transaction).
bool recount_if_unknown(bool repair);

// For a view's read: whether the counts are known, recounting at once when
// the tables are small or no background worker would do it, and asking for
// one otherwise.
bool counts_for_view();

// The rows of key_counts() or outbox_counts(): per name, its values (and
// its latest time `with_latest`), then their totals in a row without a
// name; none while the counts are unknown. Without the library preloaded,
// counted from the table. A set-returning function's body.
Datum counts_rows(FunctionCallInfo fcinfo, GaugeFamily family, bool with_latest);

}  // namespace idem::pg
