// The stdout sink: one JSON object per line, flushed before the event is
// acked: {"id":1,"topic":"t","key":"k","headers":{...},"payload":{...},"attempt":1}
#pragma once

#include <string>

#include "relay/sink.hpp"

namespace idem::relay {

// The line for an event, without the newline.
std::string stdout_line(const Event& event);

class StdoutTarget : public SinkTarget {
public:
    std::unique_ptr<Sink> open() override;
    Millis max_delivery_time() const override { return Millis(0); }
    std::string fatal_error() const override;
    std::string describe() const override { return "stdout"; }
};

}  // namespace idem::relay
