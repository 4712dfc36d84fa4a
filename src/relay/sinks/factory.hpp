// The sink that --sink names: stdout, nats://, amqp:// or amqps://, else an
// HTTP URL. Above the concrete sinks, so that their base (sink.hpp) knows
// none of them.
#pragma once

#include <memory>
#include <string>

#include "relay/options.hpp"
#include "relay/sinks/sink.hpp"

namespace idem::relay {

// The target for --sink; nullptr with *error set when it is not usable.
std::unique_ptr<SinkTarget> make_sink_target(const Options& options, std::string* error);

}  // namespace idem::relay
