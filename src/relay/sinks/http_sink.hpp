// The HTTP sink (libcurl): POSTs each event's payload to the --sink URL.
#pragma once

#include <memory>
#include <string>

#include "relay/sinks/sink.hpp"

namespace idem::relay {

// Validates the URL; nullptr with *error when it is not usable.
std::unique_ptr<SinkTarget> make_http_target(const Options& options, std::string* error);

}  // namespace idem::relay
