// The notifier of one database (`idempotency notifier` in pg_stat_activity):
// started by the launcher when a committing backend asks for it, it sends
// the outbox NOTIFYs of that database's committed enqueues. Each time it
// wakes it takes the topics waiting in its slot and sends one NOTIFY per
// topic in one short transaction of its own, however many commits published
// them, and one with the payload "*" (any topic) for commits whose topics
// did not fit in the slot. It leaves after idling for idempotency.launcher_naptime, on SIGTERM,
// when the workers are disabled, and when a command needs the database to
// itself (DROP DATABASE): first it stops taking pins, then it sends what the
// pinned committers publish, and only then does it exit.
#include <cstring>

#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/notifier_table.hpp"
#include "pg/outbox/notify.hpp"
#include "pg/runtime/background_session.hpp"
#include "pg/runtime/database_yield.hpp"

extern "C" {
#include "commands/async.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"

PGDLLEXPORT void idem_notifier_main(Datum);
}

namespace idem::pg {

namespace {

constexpr long kProbeMs = 500;         // how often DROP DATABASE is looked for
constexpr long kDrainPollMs = 10;      // while waiting for pinned committers
constexpr Micros kDrainLimit = 5 * kSecond;
// After a round, commits of the next millisecond are gathered into one
// round: under load this bounds the notifier's transactions (each takes an
// xid and PostgreSQL's NOTIFY lock) at little cost in wake-up latency.
constexpr long kRoundGapMs = 1;

TopicList batch;  // large: kept out of the stack

void send_notifies(const TopicList& topics, bool any_topic) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    pgstat_report_activity(STATE_RUNNING, "idempotency: outbox notifications");
    for (int i = 0; i < topics.count; ++i) Async_Notify(kOutboxChannel, topics.names[i]);
    if (any_topic) Async_Notify(kOutboxChannel, kAnyTopic);
    CommitTransactionCommand();
    pgstat_report_activity(STATE_IDLE, nullptr);
}

bool database_wanted_now() {
    StartTransactionCommand();
    const bool wanted = database_wanted_elsewhere(MyDatabaseId);
    CommitTransactionCommand();
    return wanted;
}

bool should_leave(Micros now, Micros last_activity, Micros* next_probe) {
    if (ShutdownRequestPending || !settings::worker_enabled) return true;
    if (now - last_activity >= settings::ms(settings::launcher_naptime_ms)) return true;
    if (now < *next_probe) return false;
    *next_probe = now + settings::ms(kProbeMs);
    return database_wanted_now();
}

void notifier_loop() {
    int slot = -1;
    std::memcpy(&slot, MyBgworkerEntry->bgw_extra, sizeof slot);
    if (!attach_notifier(slot, MyDatabaseId)) return;
    before_shmem_exit(detach_on_exit, Int32GetDatum(slot));
    // Its transactions change no data: their commits need not wait for the
    // WAL flush, which keeps the NOTIFY lock held only briefly.
    SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    pgstat_report_activity(STATE_IDLE, nullptr);

    Micros last_activity = GetCurrentTimestamp();
    Micros next_probe = 0;
    Micros leaving_since = 0;
    for (;;) {
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        const Micros now = GetCurrentTimestamp();
        if (leaving_since == 0 && should_leave(now, last_activity, &next_probe)) {
            stop_accepting(slot);
            leaving_since = now;
        }
        std::uint64_t overflow_marks = 0;
        if (take_topics(slot, &batch, &overflow_marks) > 0) {
            send_notifies(batch, overflow_marks != 0);
            topics_sent(slot, batch.count, overflow_marks);
            last_activity = now;
            (void)WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kRoundGapMs, PG_WAIT_EXTENSION);
            continue;
        }
        // A committer that never unpins has died without a crash restart (it
        // cannot): the limit only bounds the wait; the exit callback then
        // asks for a successor.
        if (leaving_since != 0 && (try_detach(slot) || now - leaving_since > kDrainLimit)) return;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        leaving_since != 0 ? kDrainPollMs : kProbeMs, PG_WAIT_EXTENSION);
    }
}

}  // namespace

}  // namespace idem::pg

// Entry point: no C++ exception may leave it. SIGTERM asks for an orderly
// exit (the loop stops taking pins and sends what was published first).
extern "C" void idem_notifier_main(Datum main_arg) {
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
    idem::pg::use_background_session_settings();
    idem::pg::guarded_main("idempotency notifier", idem::pg::notifier_loop);
    proc_exit(0);
}
