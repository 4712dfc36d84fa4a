#include "relay/sink.hpp"

#include "relay/http_sink.hpp"
#include "relay/stdout_sink.hpp"

namespace idem::relay {

std::unique_ptr<SinkTarget> make_sink_target(const Options& options, std::string* error) {
    if (options.sink == "stdout") return std::make_unique<StdoutTarget>(options.http_timeout);
    return make_http_target(options, error);
}

}  // namespace idem::relay
