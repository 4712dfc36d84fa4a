#include "relay/stdout_sink.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "relay/json.hpp"

namespace idem::relay {

namespace {

// stdout is shared by every delivery thread: one line at a time.
std::mutex stdout_mutex;
std::atomic<int> stdout_errno{0};

class StdoutSink : public Sink {
public:
    Outcome deliver(const Event& event) override {
        std::string line = stdout_line(event);
        line += '\n';
        std::lock_guard<std::mutex> lock(stdout_mutex);
        if (stdout_errno.load() != 0) return Outcome::retry(error_text(stdout_errno.load()));
        if (fwrite(line.data(), 1, line.size(), stdout) != line.size() || fflush(stdout) != 0) {
            const int error = errno != 0 ? errno : EIO;
            stdout_errno.store(error);
            clearerr(stdout);
            return Outcome::retry(error_text(error));
        }
        return Outcome::ack();
    }

private:
    static std::string error_text(int error) { return std::string("stdout: ") + strerror(error); }
};

}  // namespace

std::string stdout_line(const Event& event) {
    std::string line;
    line.reserve(96 + event.payload.size() + (event.headers ? event.headers->size() : 0));
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
    return line;
}

std::unique_ptr<Sink> StdoutTarget::open() { return std::make_unique<StdoutSink>(); }

std::string StdoutTarget::fatal_error() const {
    const int error = stdout_errno.load();
    return error == 0 ? std::string() : std::string("cannot write to stdout: ") + strerror(error);
}

}  // namespace idem::relay
