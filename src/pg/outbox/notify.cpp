#include "pg/outbox/notify.hpp"

#include <cstring>

#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/notifier_table.hpp"

extern "C" {
#include "commands/async.h"
}

namespace idem::pg {

namespace {

// The current transaction's topics for the notifier, and its pinned slot
// (between the pre-commit and the end of the transaction).
TopicList deferred;
bool deferred_overflow = false;  // more distinct topics than a slot holds
int pinned_slot = -1;
bool pinned_overflow = false;    // the commit marks the slot overflowed

bool deferring_possible() {
    return notifier_table_available() && settings::worker_enabled && !IsInParallelMode();
}

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

void on_transaction_event(XactEvent event, void*) {
    if (deferred.count == 0 && !deferred_overflow && pinned_slot < 0) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
        // Still inside the transaction: either a notifier is pinned to send
        // the topics after the commit, or the commit sends them itself.
        pinned_slot = pin_notifier(MyDatabaseId, deferred.count, deferred_overflow, &pinned_overflow);
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
        // COMMIT PREPARED may run anywhere, later: nothing would notify then.
        // PostgreSQL refuses PREPARE after a NOTIFY for the same reason.
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("cannot PREPARE a transaction that has enqueued outbox events "
                        "while idempotency.outbox_notify is on"),
                 errhint("SET LOCAL idempotency.outbox_notify = off before enqueuing; "
                         "relays then find the events when they poll.")));
        break;
    case XACT_EVENT_PREPARE:
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
        deferred_overflow = true;
        return;
    }
    std::memcpy(deferred.names[deferred.count], name, bytes);
    deferred.names[deferred.count][bytes] = '\0';
    ++deferred.count;
}

void install_outbox_notify_callbacks() { register_guarded_callback(on_transaction_event); }

}  // namespace idem::pg
