#include "pg/keys/key_counts.hpp"

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

}  // namespace

void count_key_transition(const text* scope, std::optional<Status> from, std::optional<Status> to) {
    if (from == to) return;
    if (from && value_of(*from) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*from), -1);
    if (to && value_of(*to) >= 0) gauge_add_on_commit(GaugeFamily::Keys, scope, value_of(*to), 1);
}

}  // namespace idem::pg
