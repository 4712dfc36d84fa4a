#include "pg/stats/count_statements.hpp"

namespace idem::pg {

namespace {

Statement kCountKeys = {
    "SELECT scope, count(*) FILTER (WHERE status = 'COMPLETED'), "
    "count(*) FILTER (WHERE status = 'FAILED_RETRYABLE'), "
    "count(*) FILTER (WHERE status = 'FAILED_FINAL') "
    "FROM @keys@ WHERE status IN ('COMPLETED', 'FAILED_RETRYABLE', 'FAILED_FINAL') "
    "GROUP BY ROLLUP (scope)",
    0, {}, nullptr};

Statement kCountEvents = {
    "SELECT topic, count(*) FILTER (WHERE state IN ('pending', 'in_flight')), "
    "count(*) FILTER (WHERE state IN ('pending', 'in_flight') AND attempts > 0), "
    "count(*) FILTER (WHERE state = 'dead'), max(delivered_at) "
    "FROM @outbox@ GROUP BY ROLLUP (topic)",
    0, {}, nullptr};

}  // namespace

Statement& count_statement(GaugeFamily family) {
    return family == GaugeFamily::Keys ? kCountKeys : kCountEvents;
}

}  // namespace idem::pg
