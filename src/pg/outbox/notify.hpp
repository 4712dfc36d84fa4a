// "On commit, listeners on channel idempotency_outbox are notified (payload:
// the topic)", without serialising commits. PostgreSQL serialises the
// commits of every transaction that sent a NOTIFY (a cluster-wide lock held
// through the commit's WAL flush). So, when the library is preloaded and the
// workers are enabled, an enqueuing transaction does not NOTIFY itself: it
// hands its topics, after its commit, to the database's notifier
// (pg/outbox/notifier.cpp), which sends them in a transaction of its own. Topics
// that do not fit in the notifier's slot become one notification with the
// payload "*" (any topic). When no notifier can take them (none running
// yet, leaving, the workers disabled) the transaction notifies in its own
// commit, as without preload. A prepared transaction's topics wait for
// COMMIT PREPARED (pg/outbox/prepared_topics.hpp).
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

inline constexpr const char* kOutboxChannel = "idempotency_outbox";

// Listeners learn of `topic` once the current transaction has committed
// (nothing when idempotency.outbox_notify is off).
void notify_outbox_on_commit(const text* topic);

// Called from _PG_init.
void install_outbox_notify_callbacks();

}  // namespace idem::pg
