// Cumulative counters in shared memory (the idem_metrics view). Counters of
// state changes are kept per transaction and added only when it commits
// (a rolled-back subtransaction's counts are dropped); counters of answers
// are added at once. Without preload, counting does nothing.
#pragma once

#include <cstdint>

#include "core/time.hpp"

namespace idem::pg {

// In the order of the idem_metrics columns (ResumedTakeovers, from 0.7.0,
// comes after processing_ms_buckets and stats_reset).
enum class Counter : int {
    Claims,
    Replays,
    InProgress,
    Mismatches,
    Completions,
    FailuresRetryable,
    FailuresFinal,
    LeaseExpirations,
    LateCompletions,
    StaleTokens,
    InboxDuplicates,
    OutboxEnqueued,
    OutboxDeduplicated,
    OutboxDelivered,
    OutboxRetried,
    OutboxDead,
    LocksAcquired,
    LocksContended,
    ProcessingCount,
    ProcessingMsSum,  // kept in microseconds, shown in ms
    ResumedTakeovers,  // claims granted on a key with finished steps
};

// An answer given: counted now, whatever becomes of the transaction.
void count_answer(Counter counter, std::uint64_t n = 1);
// A state change: counted if and when the transaction commits.
void count_on_commit(Counter counter, std::uint64_t n = 1);
// A claim-to-complete time, counted on commit with the processing counters.
void observe_processing_on_commit(Micros elapsed);

// Registers the transaction callbacks (once per backend, from _PG_init).
void install_metrics_callbacks();

}  // namespace idem::pg
