// A self-pipe that wakes the database thread's poll(): written by delivery
// threads when results are ready and by the signal handler.
#pragma once

namespace idem::relay {

class WakePipe {
public:
    WakePipe();
    ~WakePipe();
    WakePipe(const WakePipe&) = delete;
    WakePipe& operator=(const WakePipe&) = delete;

    bool ok() const { return read_fd_ >= 0; }
    int fd() const { return read_fd_; }   // to poll for POLLIN
    void notify() const;                   // async-signal-safe
    void drain() const;

private:
    int read_fd_ = -1;
    int write_fd_ = -1;
};

}  // namespace idem::relay
