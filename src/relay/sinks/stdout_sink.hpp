// The stdout sink: one JSON object per line,
// {"id":1,"topic":"t","key":"k","headers":{...},"payload":{...},"attempt":1}.
// An event is acked once its line is flushed, and when stdout is a pipe once
// the reader has read it; a closed pipe stops the relay.
#pragma once

#include <string>

#include "relay/sinks/sink.hpp"

namespace idem::relay {

// The line for an event, without the newline; appended to `line` (a
// group's lines are written in place, not copied from a line each).
void append_stdout_line(std::string& line, const Event& event);
std::string stdout_line(const Event& event);

class StdoutTarget : public SinkTarget {
public:
    // bound: how long a reader of a pipe may take to read a line.
    explicit StdoutTarget(Millis bound);
    std::unique_ptr<Sink> open() override;
    Millis max_delivery_time() const override { return pipe_ ? bound_ : Millis(0); }
    // Lines of many events go out with one write in a file; in a pipe one
    // at a time, so that a reader that stops (| head -1) takes exactly
    // the lines it read.
    std::size_t group_size() const override { return pipe_ ? 1 : 1000; }
    // A group is one write: in order, all or nothing.
    bool groups_keep_order() const override { return true; }
    std::string fatal_error() const override;
    std::string describe() const override { return pipe_ ? "stdout (a pipe)" : "stdout"; }

private:
    bool pipe_;
    Millis bound_;
};

}  // namespace idem::relay
