#include "pg/stats/metrics.hpp"

#include <algorithm>
#include <cstring>

#include "pg/boundary/arrays.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/stats/counters.hpp"

namespace idem::pg {

namespace {

// Upper bounds (ms) of processing_ms_buckets; the last bucket is +infinity.
constexpr std::int64_t kBucketBounds[kBucketCount - 1] = {1, 5, 10, 50, 100, 500, 1000, 5000, 10000};

// Counts a transaction made, by subtransaction nesting level (deeper levels
// share the last entry).
constexpr int kLevels = 32;
struct PendingCounts {
    std::uint64_t counters[kCounterCount];
    std::uint64_t buckets[kBucketCount];
};
PendingCounts pending[kLevels];
bool anything_pending = false;
int levels_used = 0;  // pending[0 .. levels_used) may hold counts

int level_index(int nest_level) { return std::clamp(nest_level - 1, 0, kLevels - 1); }

void clear_level(int index) { std::memset(&pending[index], 0, sizeof(PendingCounts)); }

void flush_pending(SharedCounters* shared) {
    for (int l = 0; l < levels_used; ++l) {
        const PendingCounts& level = pending[l];
        for (int i = 0; i < kCounterCount; ++i)
            if (level.counters[i] != 0) pg_atomic_fetch_add_u64(&shared->counters[i], level.counters[i]);
        for (int i = 0; i < kBucketCount; ++i)
            if (level.buckets[i] != 0) pg_atomic_fetch_add_u64(&shared->buckets[i], level.buckets[i]);
    }
}

void on_transaction_end(XactEvent event, void*) {
    if (!anything_pending) return;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
        event == XACT_EVENT_PREPARE) {
        if (SharedCounters* shared = shared_counters()) flush_pending(shared);
    } else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT) {
        return;  // pre-commit events: not yet decided
    }
    std::memset(pending, 0, sizeof(PendingCounts) * levels_used);
    levels_used = 0;
    anything_pending = false;
}

void on_subtransaction_end(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    if (!anything_pending) return;
    const int index = level_index(GetCurrentTransactionNestLevel());
    if (index == 0 || index == kLevels - 1) {
        if (event == SUBXACT_EVENT_ABORT_SUB && index == kLevels - 1) clear_level(index);
        return;
    }
    if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (int i = 0; i < kCounterCount; ++i) pending[index - 1].counters[i] += pending[index].counters[i];
        for (int i = 0; i < kBucketCount; ++i) pending[index - 1].buckets[i] += pending[index].buckets[i];
        clear_level(index);
    } else if (event == SUBXACT_EVENT_ABORT_SUB) {
        clear_level(index);
    }
}

PendingCounts& current_level() {
    anything_pending = true;
    const int index = level_index(GetCurrentTransactionNestLevel());
    levels_used = std::max(levels_used, index + 1);
    return pending[index];
}

}  // namespace

void count_answer(Counter counter, std::uint64_t n) {
    if (SharedCounters* shared = shared_counters())
        pg_atomic_fetch_add_u64(&shared->counters[static_cast<int>(counter)], n);
}

void count_on_commit(Counter counter, std::uint64_t n) {
    if (shared_counters() == nullptr || n == 0) return;
    current_level().counters[static_cast<int>(counter)] += n;
}

void observe_processing_on_commit(Micros elapsed) {
    if (shared_counters() == nullptr) return;
    // Kept in microseconds (shown in ms): truncating each time to whole ms
    // would drop up to 1 ms per complete from the sum, and would put a time
    // just over a bound (100.4 ms) into the bucket below it.
    const Micros us = std::max<Micros>(0, elapsed);
    PendingCounts& level = current_level();
    level.counters[static_cast<int>(Counter::ProcessingCount)] += 1;
    level.counters[static_cast<int>(Counter::ProcessingMsSum)] += static_cast<std::uint64_t>(us);
    int bucket = 0;
    while (bucket < kBucketCount - 1 && us > kBucketBounds[bucket] * kMillisecond) ++bucket;
    level.buckets[bucket] += 1;
}

void install_metrics_callbacks() {
    register_guarded_callback(on_transaction_end);
    register_guarded_callback(on_subtransaction_end);
}

namespace {

Datum metrics_body(FunctionCallInfo fcinfo) {
    SharedCounters* shared = require_shared_counters("idem_metrics");
    TupleDesc desc = nullptr;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
        elog(ERROR, "idempotency: idem_metrics must return a row");
    desc = BlessTupleDesc(desc);

    // The counters up to ProcessingMsSum, the buckets and stats_reset (the
    // columns of 0.6.0), then the counters 0.7.0 added after them.
    constexpr int kFirstCounters = static_cast<int>(Counter::ProcessingMsSum) + 1;
    constexpr int kLaterCounters = kCounterCount - kFirstCounters;
    constexpr int kColumns = kCounterCount + 2;
    if (desc->natts != kColumns && desc->natts != kColumns - kLaterCounters)
        elog(ERROR, "idempotency: idem_metrics_row returns %d columns, not %d", desc->natts,
             kColumns);
    Datum values[kColumns];
    bool nulls[kColumns] = {};
    auto counter_datum = [shared](int i) {
        return Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&shared->counters[i])));
    };
    for (int i = 0; i < kFirstCounters; ++i) values[i] = counter_datum(i);
    // processing_ms_sum is kept in microseconds.
    constexpr int kMsSum = static_cast<int>(Counter::ProcessingMsSum);
    values[kMsSum] = Int64GetDatum(
        static_cast<int64>(pg_atomic_read_u64(&shared->counters[kMsSum]) / kMillisecond));
    Datum buckets[kBucketCount];
    for (int i = 0; i < kBucketCount; ++i)
        buckets[i] = Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&shared->buckets[i])));
    values[kFirstCounters] = int8_array(buckets, kBucketCount);
    SpinLockAcquire(&shared->mutex);
    values[kFirstCounters + 1] = TimestampTzGetDatum(shared->stats_reset);
    SpinLockRelease(&shared->mutex);
    for (int i = kFirstCounters; i < kCounterCount; ++i) values[i + 2] = counter_datum(i);
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

Datum metrics_reset_body(FunctionCallInfo) {
    SharedCounters* shared = require_shared_counters("idem_metrics_reset");
    for (auto& counter : shared->counters) pg_atomic_write_u64(&counter, 0);
    for (auto& bucket : shared->buckets) pg_atomic_write_u64(&bucket, 0);
    SpinLockAcquire(&shared->mutex);
    shared->stats_reset = GetCurrentTimestamp();
    SpinLockRelease(&shared->mutex);
    PG_RETURN_VOID();
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION_AS_CALLER(idem_metrics_row, idem::pg::metrics_body)
IDEM_SQL_FUNCTION_AS_CALLER(idem_metrics_reset, idem::pg::metrics_reset_body)
