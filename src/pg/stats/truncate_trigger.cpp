// idempotency.counts_truncated(): the AFTER TRUNCATE trigger of the tables
// the counts are kept for (idempotency_keys and outbox). TRUNCATE removes
// their rows without a change the counts could follow (a DBA emptying a
// backlog), so the counts of the database become unknown at its commit and
// are recounted from the tables (pg/stats/gauges.hpp).
#include "core/error.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/stats/gauges.hpp"

extern "C" {
#include "commands/trigger.h"
}

namespace idem::pg {

namespace {

Datum counts_truncated_body(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo) ||
        !TRIGGER_FIRED_BY_TRUNCATE(reinterpret_cast<TriggerData*>(fcinfo->context)->tg_event))
        throw Error("39P01", "idempotency.counts_truncated() fires only after TRUNCATE");
    gauges_truncated_on_commit();
    return PointerGetDatum(nullptr);
}

}  // namespace

}  // namespace idem::pg

// Touches no table: run as the caller (the role that truncated).
IDEM_SQL_FUNCTION_AS_CALLER(idem_counts_truncated, idem::pg::counts_truncated_body)
