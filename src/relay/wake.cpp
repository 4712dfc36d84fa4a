#include "relay/wake.hpp"

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

namespace idem::relay {

WakePipe::WakePipe() {
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
        read_fd_ = fds[0];
        write_fd_ = fds[1];
    }
}

WakePipe::~WakePipe() {
    if (read_fd_ >= 0) close(read_fd_);
    if (write_fd_ >= 0) close(write_fd_);
}

void WakePipe::notify() const {
    const int saved = errno;
    const char byte = 1;
    // A full pipe already wakes the reader.
    ssize_t ignored = write(write_fd_, &byte, 1);
    (void)ignored;
    errno = saved;
}

void WakePipe::drain() const {
    char buffer[256];
    while (read(read_fd_, buffer, sizeof buffer) > 0) {
    }
}

}  // namespace idem::relay
