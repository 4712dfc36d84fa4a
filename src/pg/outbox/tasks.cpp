#include "pg/outbox/tasks.hpp"

#include "pg/boundary/settings.hpp"
#include "pg/outbox/store.hpp"
#include "pg/stats/metrics.hpp"

namespace idem::pg {

std::uint64_t expire_outbox_leases(int batch) {
    std::uint64_t dead = 0;
    const std::uint64_t expired =
        expire_event_leases(batch, settings::outbox_max_attempts, GetCurrentTimestamp(), &dead);
    count_on_commit(Counter::OutboxRetried, expired - dead);
    count_on_commit(Counter::OutboxDead, dead);
    return expired;
}

std::uint64_t purge_outbox(int batch) {
    return purge_delivered_events(
        batch, GetCurrentTimestamp() - settings::seconds(settings::outbox_retention_s));
}

}  // namespace idem::pg
