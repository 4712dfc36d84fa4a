// The counts of a gauge family from its table, per name, and (ROLLUP)
// their totals in a row without a name: a recount (recount.hpp) keeps those
// with a name, and the views' functions (count_functions.cpp) return them
// all when the counts are not kept. Its columns are those of key_counts()
// and outbox_counts().
#pragma once

#include "pg/access/spi.hpp"
#include "pg/stats/gauges.hpp"

namespace idem::pg {

Statement& count_statement(GaugeFamily family);

}  // namespace idem::pg
