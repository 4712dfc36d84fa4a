#include "relay/sinks/socket_deadline.hpp"

#include <algorithm>
#include <chrono>
#include <sys/socket.h>

namespace idem::relay {

namespace {
// How often an armed watchdog looks at the stop (a second SIGTERM).
constexpr std::chrono::milliseconds kAbortPoll{50};
}  // namespace

SocketDeadline::~SocketDeadline() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        quit_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void SocketDeadline::arm(int fd, Clock::time_point deadline) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fd_ = fd;
        deadline_ = deadline;
        fired_ = false;
        if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
    }
    changed_.notify_all();
}

bool SocketDeadline::disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    fd_ = -1;
    return fired_;
}

void SocketDeadline::watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!quit_) {
        if (fd_ < 0) {
            changed_.wait(lock);
            continue;
        }
        const Clock::time_point now = Clock::now();
        if (now >= deadline_ || aborted_.load()) {
            // The blocked call sees the socket fail; the fd stays open (its
            // owner closes it), so no other file can take its number.
            shutdown(fd_, SHUT_RDWR);
            fired_ = true;
            fd_ = -1;
            continue;
        }
        changed_.wait_until(lock, std::min(deadline_, now + kAbortPoll));
    }
}

}  // namespace idem::relay
