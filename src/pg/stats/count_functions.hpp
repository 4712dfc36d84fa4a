// The rows of key_counts() and outbox_counts(), behind idem_stats and
// outbox_lag: per name (a scope, a topic) its values (and its latest time
// `with_latest`), then their totals in a row without a name; no row while
// the counts are unknown. Read from the gauges (pg/stats/gauges.hpp) where
// they are kept; counted from the table where they are not (the library
// not preloaded, or a database whose names did not fit in shared memory).
// From 0.7.0 each row also says which, in its last column counted_by:
// 'commits' or 'scan'.
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/stats/gauges.hpp"

namespace idem::pg {

// A set-returning function's body.
Datum counts_rows(FunctionCallInfo fcinfo, GaugeFamily family, bool with_latest);

}  // namespace idem::pg
