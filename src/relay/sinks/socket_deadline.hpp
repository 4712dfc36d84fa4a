// Bounds calls that a client library may block in without a deadline of its
// own (rabbitmq-c's amqp_basic_publish waits for ever while a broker that
// raised a memory alarm has stopped reading): while armed, a watchdog
// thread shuts the socket down once the deadline passes or the relay is
// told to hurry, so that the blocked call fails at once. Armed and disarmed
// once per group of publishes, not per event.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "relay/event.hpp"

namespace idem::relay {

class SocketDeadline {
public:
    explicit SocketDeadline(const std::atomic<bool>& aborted) : aborted_(aborted) {}
    ~SocketDeadline();
    SocketDeadline(const SocketDeadline&) = delete;
    SocketDeadline& operator=(const SocketDeadline&) = delete;

    // From now until disarm(), fd is shut down at deadline (or on abort).
    void arm(int fd, Clock::time_point deadline);
    // True when the watchdog cut the socket since arm().
    bool disarm();

private:
    void watch();

    const std::atomic<bool>& aborted_;
    std::mutex mutex_;
    std::condition_variable changed_;
    int fd_ = -1;  // -1: disarmed
    Clock::time_point deadline_{};
    bool fired_ = false;
    bool quit_ = false;
    std::thread thread_;
};

}  // namespace idem::relay
