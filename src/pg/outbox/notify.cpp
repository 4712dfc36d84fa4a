#include "pg/outbox/notify.hpp"

#include <cstring>

#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/notifier_table.hpp"
#include "pg/outbox/prepared_topics.hpp"

extern "C" {
#include "commands/async.h"
}

namespace idem::pg {

namespace {

// The current transaction's topics for the notifier, and its pinned slot
// (between the pre-commit and the end of the transaction). Each topic keeps
// the subtransaction level that added it, so that a rolled-back savepoint
// takes its topics back, as PostgreSQL does with a NOTIFY.
TopicList deferred;
int deferred_levels[kNotifierTopics];
bool deferred_overflow = false;  // more distinct topics than a slot holds
int overflow_level = 0;          // the level at which it first overflowed
int pinned_slot = -1;
bool pinned_overflow = false;    // the commit marks the slot overflowed
// The transaction being prepared (read before PREPARE ends it).
TransactionId preparing_xid = InvalidTransactionId;

// Topics are kept until the commit (or PREPARE) whenever the library is
// preloaded; the commit then hands them to a notifier, or notifies them
// itself when none can take them (the workers disabled, none running yet).
bool deferring_possible() { return notifier_table_available() && !IsInParallelMode(); }

bool already_deferred(const char* name, std::size_t bytes) {
    for (int i = 0; i < deferred.count; ++i)
        if (strncmp(deferred.names[i], name, bytes) == 0 && deferred.names[i][bytes] == '\0')
            return true;
    return false;
}

void notify_deferred_now() {
    for (int i = 0; i < deferred.count; ++i) Async_Notify(kOutboxChannel, deferred.names[i]);
    if (deferred_overflow) Async_Notify(kOutboxChannel, kAnyTopic);
    deferred.count = 0;
    deferred_overflow = false;
}

void forget_transaction() {
    deferred.count = 0;
    deferred_overflow = false;
    pinned_slot = -1;
    pinned_overflow = false;
}

// A savepoint released: its topics belong to its parent. Rolled back:
// they are dropped (the topics past the slot's room were all added at
// that level or deeper, so the overflow goes with them).
void on_subtransaction_event(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    if (deferred.count == 0 && !deferred_overflow) return;
    const int level = GetCurrentTransactionNestLevel();
    if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (int i = 0; i < deferred.count; ++i)
            if (deferred_levels[i] == level) deferred_levels[i] = level - 1;
        if (overflow_level == level) overflow_level = level - 1;
    } else if (event == SUBXACT_EVENT_ABORT_SUB) {
        int kept = 0;
        for (int i = 0; i < deferred.count; ++i) {
            if (deferred_levels[i] >= level) continue;
            if (kept != i) std::memcpy(deferred.names[kept], deferred.names[i], kTopicBytes);
            deferred_levels[kept++] = deferred_levels[i];
        }
        deferred.count = kept;
        if (deferred_overflow && overflow_level >= level) deferred_overflow = false;
    }
}

void on_transaction_event(XactEvent event, void*) {
    if (deferred.count == 0 && !deferred_overflow && pinned_slot < 0) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
        // Still inside the transaction: either a notifier is pinned to send
        // the topics after the commit, or the commit sends them itself.
        pinned_slot = settings::worker_enabled ? pin_notifier(MyDatabaseId, deferred.count,
                                                              deferred_overflow, &pinned_overflow)
                                               : -1;
        if (pinned_slot < 0) notify_deferred_now();
        break;
    case XACT_EVENT_COMMIT:
        if (pinned_slot >= 0)
            publish_and_unpin(pinned_slot, deferred.count, &deferred, pinned_overflow);
        forget_transaction();
        break;
    case XACT_EVENT_ABORT:
        if (pinned_slot >= 0)
            publish_and_unpin(pinned_slot, deferred.count, nullptr, pinned_overflow);
        forget_transaction();
        break;
    case XACT_EVENT_PRE_PREPARE:
        // COMMIT PREPARED may run later, in another session: the topics wait
        // for it in shared memory (pg/outbox/prepared_topics.hpp).
        preparing_xid = GetTopTransactionIdIfAny();
        break;
    case XACT_EVENT_PREPARE:
        park_topics(preparing_xid, deferred, deferred_overflow);
        forget_transaction();
        break;
    default:
        break;
    }
}

}  // namespace

void notify_outbox_on_commit(const text* topic) {
    if (!settings::outbox_notify) return;
    const char* name = VARDATA_ANY(topic);
    const std::size_t bytes = VARSIZE_ANY_EXHDR(topic);
    if (!deferring_possible() || bytes >= static_cast<std::size_t>(kTopicBytes)) {
        Async_Notify(kOutboxChannel, text_to_cstring(topic));
        return;
    }
    if (deferred_overflow || already_deferred(name, bytes)) return;
    // More distinct topics than a slot holds: the notifier sends "*".
    if (deferred.count == kNotifierTopics) {
        if (!deferred_overflow) overflow_level = GetCurrentTransactionNestLevel();
        deferred_overflow = true;
        return;
    }
    std::memcpy(deferred.names[deferred.count], name, bytes);
    deferred.names[deferred.count][bytes] = '\0';
    deferred_levels[deferred.count] = GetCurrentTransactionNestLevel();
    ++deferred.count;
}

void install_outbox_notify_callbacks() {
    register_guarded_callback(on_transaction_event);
    register_guarded_callback(on_subtransaction_event);
}

}  // namespace idem::pg
