#include "relay/sinks/stdout_sink.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay/json.hpp"

namespace idem::relay {

namespace {

// stdout is shared by every delivery thread: one line at a time.
std::mutex stdout_mutex;
std::atomic<int> stdout_errno{0};

std::string error_text(int error) { return std::string("stdout: ") + strerror(error); }

// Waits until the reader of the pipe on stdout has read everything in it.
// EPIPE when the reader went away first, ETIMEDOUT after the bound.
int wait_until_read(Millis bound) {
    const Clock::time_point deadline = Clock::now() + bound;
    long pause_us = 20;
    for (;;) {
        int unread = 0;
        if (ioctl(STDOUT_FILENO, FIONREAD, &unread) != 0) return 0;  // cannot tell: flushed is all
        if (unread == 0) return 0;
        if (Clock::now() >= deadline) return ETIMEDOUT;
        // Asking for no event still reports POLLERR once the reader is gone.
        pollfd fd = {STDOUT_FILENO, 0, 0};
        const timespec pause = {0, pause_us * 1000};
        if (ppoll(&fd, 1, &pause, nullptr) > 0 && (fd.revents & (POLLERR | POLLHUP)) != 0) {
            // Gone, perhaps right after reading everything.
            return ioctl(STDOUT_FILENO, FIONREAD, &unread) == 0 && unread == 0 ? 0 : EPIPE;
        }
        pause_us = std::min(pause_us * 2, 1000L);
    }
}

// Room for an event's line and its newline, short of escapes.
std::size_t line_size(const Event& event) {
    return 96 + event.topic.size() + (event.key ? event.key->size() : 0) + event.payload.size() +
           (event.headers ? event.headers->size() : 0);
}

class StdoutSink : public Sink {
public:
    StdoutSink(bool pipe, Millis bound) : pipe_(pipe), bound_(bound) {}

    Outcome deliver(const Event& event) override {
        std::string line = stdout_line(event);
        line += '\n';
        return write_lines(line);
    }

    // One write and one flush for the group's lines: a pipe's reader has
    // read either all of them or not all.
    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override {
        std::size_t size = 0;
        for (const Event* event : events) size += line_size(*event);
        std::string lines;
        lines.reserve(size);
        for (const Event* event : events) {
            append_stdout_line(lines, *event);
            lines += '\n';
        }
        outcomes->assign(events.size(), write_lines(lines));
    }

private:
    Outcome write_lines(const std::string& lines) {
        std::lock_guard<std::mutex> lock(stdout_mutex);
        if (stdout_errno.load() != 0) return Outcome::skip(error_text(stdout_errno.load()));
        errno = 0;
        if (fwrite(lines.data(), 1, lines.size(), stdout) != lines.size() || fflush(stdout) != 0) {
            const int error = errno != 0 ? errno : EIO;
            stdout_errno.store(error);
            clearerr(stdout);
            return Outcome::retry(error_text(error));
        }
        // In a pipe, a line is taken once the reader has read it: a reader
        // that exits (| head -1) leaves what it never read unacked.
        const int error = pipe_ ? wait_until_read(bound_) : 0;
        if (error == EPIPE) {
            stdout_errno.store(error);
            return Outcome::retry("stdout: the reader closed the pipe before reading the line");
        }
        if (error == ETIMEDOUT)
            return Outcome::retry("stdout: the reader did not read the line within " +
                                  std::to_string(bound_.count()) + " ms");
        return Outcome::ack();
    }

    bool pipe_;
    Millis bound_;
};

bool stdout_is_pipe() {
    struct stat st;
    return fstat(STDOUT_FILENO, &st) == 0 && S_ISFIFO(st.st_mode);
}

}  // namespace

void append_stdout_line(std::string& line, const Event& event) {
    line += "{\"id\":";
    line += std::to_string(event.id);
    line += ",\"topic\":";
    append_json_string(line, event.topic);
    line += ",\"key\":";
    if (event.key) append_json_string(line, *event.key);
    else line += "null";
    line += ",\"headers\":";
    line += event.headers ? *event.headers : "null";
    line += ",\"payload\":";
    line += event.payload;
    line += ",\"attempt\":";
    line += std::to_string(event.attempt);
    line += '}';
}

std::string stdout_line(const Event& event) {
    std::string line;
    line.reserve(line_size(event));
    append_stdout_line(line, event);
    return line;
}

StdoutTarget::StdoutTarget(Millis bound) : pipe_(stdout_is_pipe()), bound_(bound) {}

std::unique_ptr<Sink> StdoutTarget::open() { return std::make_unique<StdoutSink>(pipe_, bound_); }

std::string StdoutTarget::fatal_error() const {
    const int error = stdout_errno.load();
    return error == 0 ? std::string() : std::string("cannot write to stdout: ") + strerror(error);
}

}  // namespace idem::relay
