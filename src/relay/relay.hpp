// The delivery loop, on the one thread that uses libpq: claim due events,
// hand them to the delivery threads, ack and nack their outcomes, wake on
// LISTEN or the poll timer, reconnect when the database goes away, drain on
// SIGTERM/SIGINT, stop after one pass with --once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relay/database.hpp"
#include "relay/event.hpp"
#include "relay/options.hpp"
#include "relay/sink.hpp"
#include "relay/stats.hpp"
#include "relay/wake.hpp"
#include "relay/worker_pool.hpp"

namespace idem::relay {

class Relay {
public:
    Relay(const Options& options, Database& db, WorkerPool& pool, SinkTarget& target,
          Stats& stats, const WakePipe& wake);

    // Runs until stopped; returns the exit status (0, or 1 after a failure).
    int run();

private:
    void on_signals(Clock::time_point now);
    void take_results();
    void reconnect(Clock::time_point now);
    bool database_unavailable(DbStatus status, const std::string& error, Clock::time_point now);
    void connection_lost(const std::string& error, Clock::time_point now);
    void flush_acks(Clock::time_point now);
    void flush_nacks(Clock::time_point now);
    void claim(Clock::time_point now);
    void progress(Clock::time_point now, bool final_line);
    Millis tick_interval() const;
    void fail(const std::string& error);
    void resolved(std::size_t count);
    void wait(Clock::time_point now);
    bool flushed() const { return to_ack_.empty() && to_nack_.empty(); }

    const Options& options_;
    Database& db_;
    WorkerPool& pool_;
    SinkTarget& target_;
    Stats& stats_;
    const WakePipe& wake_;

    std::int64_t in_flight_ = 0;       // claimed and not yet acked, nacked or skipped
    std::vector<Delivery> to_ack_;     // delivered, ack not yet written
    std::vector<Delivery> to_nack_;    // failed, nack not yet written
    bool due_ = true;                  // claim as soon as there is room
    bool once_done_ = false;
    Clock::time_point next_poll_{};
    Clock::time_point retry_db_at_{};  // after a transient error
    Clock::time_point reconnect_at_{};
    Clock::time_point lost_since_{};
    Backoff backoff_;
    int reconnect_attempts_ = 0;

    bool stopping_ = false;
    bool abandoned_ = false;
    Clock::time_point stop_at_{};
    int exit_code_ = 0;

    bool lag_enabled_ = true;
    Clock::time_point next_progress_{};
    Clock::time_point last_progress_{};
    std::uint64_t last_delivered_ = 0;
    double interval_max_delay_ = 0;
};

}  // namespace idem::relay
