// --maintenance-interval: idempotency.idem_maintenance() called on an
// interval, on a thread and a connection of its own, so that a slow pass
// never holds up a delivery and a failed one never stops the relay: the
// failure is logged and the next pass still made (on a new connection when
// the old one was lost).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "relay/options.hpp"

struct pg_conn;
struct pg_cancel;

namespace idem::relay {

class MaintenanceCaller {
public:
    explicit MaintenanceCaller(const Options& options);
    ~MaintenanceCaller();
    MaintenanceCaller(const MaintenanceCaller&) = delete;
    MaintenanceCaller& operator=(const MaintenanceCaller&) = delete;

    // Nothing when the option is not given. The first pass is made at once,
    // the next ones the interval after the end of the one before.
    void start();
    // Ends the thread once the running pass is over; a pass still running
    // after a few seconds is cancelled (it rolls back; the next caller
    // makes it again). The first pass is always made.
    void stop();

private:
    void run();
    void call_once();
    bool connect();
    void disconnect();

    const Options& options_;
    std::mutex mutex_;
    std::condition_variable changed_;
    bool stopping_ = false;
    bool finished_ = false;
    bool cut_short_ = false;
    pg_cancel* cancel_ = nullptr;  // under mutex_: stop() cancels through it
    pg_conn* conn_ = nullptr;      // the thread's only
    std::thread thread_;
};

}  // namespace idem::relay
