#include "pg/keys/key_counts.hpp"

#include "pg/boundary/guard.hpp"
#include "pg/stats/count_functions.hpp"
#include "pg/stats/gauges.hpp"

namespace idem::pg {

namespace {

int value_of(Status status) {
    switch (status) {
        case Status::Completed: return kCompletedValue;
        case Status::FailedRetryable: return kFailedRetryableValue;
        case Status::FailedFinal: return kFailedFinalValue;
        case Status::Received:
        case Status::Processing: break;
    }
    return -1;
}

// idempotency.key_counts(): no row while the counts are unknown.
Datum key_counts_body(FunctionCallInfo fcinfo) {
    return counts_rows(fcinfo, GaugeFamily::Keys, false);
}

}  // namespace

void count_key_transition(const text* scope, std::optional<Status> from, std::optional<Status> to) {
    if (from == to) return;
    if (from && value_of(*from) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*from), -1);
    if (to && value_of(*to) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*to), 1);
}

}  // namespace idem::pg

// 0.6.0's key_counts(); 0.7.0's, with counted_by, has a symbol of its own,
// which a library older than 0.7.0 lacks: an update or install run while
// the server still has the old library preloaded fails at once, instead of
// the old code filling a row of the new shape.
IDEM_SQL_FUNCTION(idem_key_counts, idem::pg::key_counts_body)
IDEM_SQL_FUNCTION(idem_key_counts_with_source, idem::pg::key_counts_body)
