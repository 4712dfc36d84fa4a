// The delivery loop of one lane (lanes.hpp), on the one thread that uses
// its connection: claim due events,
// hand them to the delivery threads, ack, nack or release their outcomes,
// wake on LISTEN or the poll timer, reconnect when the database goes away,
// drain on SIGTERM/SIGINT, stop after one pass with --once, and stop with a
// failure when the sink looks misconfigured or an ack cannot be written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/db/database.hpp"
#include "relay/event.hpp"
#include "relay/loop/claim_budget.hpp"
#include "relay/loop/claim_sizer.hpp"
#include "relay/loop/lanes.hpp"
#include "relay/loop/open_claim.hpp"
#include "relay/loop/reconnect_backoff.hpp"
#include "relay/loop/settle_queues.hpp"
#include "relay/loop/sink_check.hpp"
#include "relay/loop/worker_pool.hpp"
#include "relay/observe/progress.hpp"
#include "relay/observe/stats.hpp"
#include "relay/options.hpp"
#include "relay/sinks/sink.hpp"
#include "relay/wake.hpp"

namespace idem::relay {

class Relay {
public:
    // progress: the lane that prints the progress lines and reads the
    // outbox lag (one of them), else nullptr.
    Relay(const Options& options, Database& db, WorkerPool& pool, SinkTarget& target,
          Stats& stats, const WakePipe& wake, LaneGroup& lanes, ProgressLine* progress);

    // Runs until stopped; returns kExitFailure when this lane failed, else
    // kExitOk (final_status judges the whole run).
    int run();

private:
    void on_signals(Clock::time_point now);
    void take_results();
    void reconnect(Clock::time_point now);
    bool database_unavailable(DbStatus status, const std::string& error, Clock::time_point now);
    void connection_lost(const std::string& error, Clock::time_point now);
    void judge(Delivery&& delivery);
    void decided(SinkCheck::State state);
    void settle_held(Clock::time_point now);
    void flush_acks(Clock::time_point now);
    void flush_nacks(Clock::time_point now);
    void flush_releases(Clock::time_point now);
    void claim(Clock::time_point now);
    Clock::duration open_claim_limit() const;
    void commit_open_claim(Clock::time_point now);
    Settlement settlement_of(const CommitBatch& batch,
                             std::vector<std::optional<std::int64_t>>* retry_ins) const;
    ClaimArgs next_claim_args(const CommitBatch& batch, ClaimBudget* budget) const;
    void commit_failed(CommitBatch&& batch, DbStatus status, const std::string& error,
                       Clock::time_point now);
    void record_commit(const CommitBatch& batch, const SettleResult& result,
                       const std::vector<std::optional<std::int64_t>>& retry_ins);
    void take_claimed(std::vector<Event>&& events, int want, const ClaimBudget& budget,
                      bool all_resolved, Clock::time_point now);
    void void_open_claim(const std::string& why);
    void acked(const std::vector<Delivery>& deliveries);
    void nacked(const Delivery& delivery, const std::string& state,
                const std::optional<std::int64_t>& retry_in);
    NackRequest nack_request(const Delivery& delivery,
                             std::optional<std::int64_t>* retry_in) const;
    bool may_claim() const;
    int claim_size() const;
    void progress(Clock::time_point now);
    Millis tick_interval() const;
    void fail(const std::string& error);
    std::size_t stop_delivering();
    void resolved(const Delivery& delivery);
    void wait(Clock::time_point now);
    void count_notifications();
    bool flushed() const { return settle_.empty(); }
    std::size_t unwritten() const { return settle_.size(); }

    const Options& options_;
    Database& db_;
    WorkerPool& pool_;
    SinkTarget& target_;
    Stats& stats_;
    const WakePipe& wake_;
    LaneGroup& lanes_;
    ProgressLine* progress_;

    std::int64_t in_flight_ = 0;        // claimed and not yet acked, nacked or released
    std::int64_t in_flight_bytes_ = 0;  // their payloads and headers
    SettleQueues settle_;               // outcomes not yet written
    SinkCheck check_;
    ClaimSizer sizer_;
    std::uint64_t notifications_counted_ = 0;
    bool counted_down_ = false;         // in stats_.lanes_down
    bool release_works_ = true;
    bool nothing_claimed_ = false;      // the last claim found nothing
    bool due_ = true;                  // claim as soon as there is room
    bool once_done_ = false;
    Clock::time_point next_poll_{};
    Clock::time_point retry_db_at_{};  // after a transient error
    Clock::time_point reconnect_at_{};
    Clock::time_point lost_since_{};
    Backoff backoff_;
    int reconnect_attempts_ = 0;

    OpenClaim open_;                    // the claim whose transaction is open

    bool stopping_ = false;
    bool abandoned_ = false;
    Clock::time_point stop_at_{};
    int exit_code_ = 0;

    bool lag_enabled_ = true;
    Clock::time_point next_progress_{};
};

}  // namespace idem::relay
