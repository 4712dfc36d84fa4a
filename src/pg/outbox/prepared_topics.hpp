// The outbox notifications of prepared transactions. A transaction that
// enqueued tells the relays its topics once it commits (pg/outbox/notify.hpp);
// a prepared one commits at COMMIT PREPARED, later and in whichever session
// of its database. Its topics are parked at PREPARE TRANSACTION under its
// xid, in shared memory (library preloaded), and notified by a session of
// that database that runs COMMIT PREPARED (pg/boundary/prepared_end.hpp),
// in that statement's own commit; ROLLBACK PREPARED drops them. Room: one
// entry of kPreparedTopics topics for each of max_prepared_transactions;
// more topics are notified as "*" (any topic). A transaction prepared when
// no entry is free, or before a restart, notifies nothing: relays find its
// events when they poll.
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/notifier_table.hpp"

namespace idem::pg {

inline constexpr int kPreparedTopics = 8;

// Shared memory: called from the module's request and startup hooks.
Size prepared_topics_size();
void request_prepared_topics_lock();
void init_prepared_topics();

// At PREPARE TRANSACTION (nothing here raises an error): parks the first
// `count` topics of `topics` of `xid`, and "*" for the rest or for
// `overflow`.
void park_topics(TransactionId xid, const TopicList& topics, bool overflow);

// From _PG_init while preloading: notifies them after COMMIT PREPARED.
void install_prepared_topics();

}  // namespace idem::pg
