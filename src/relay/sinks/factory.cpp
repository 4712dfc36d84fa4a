#include "relay/sinks/factory.hpp"

#include <cstring>
#include <strings.h>

#include "relay/sinks/amqp_sink.hpp"
#include "relay/sinks/http_sink.hpp"
#include "relay/sinks/nats_sink.hpp"
#include "relay/sinks/stdout_sink.hpp"

namespace idem::relay {

namespace {

bool starts_with_scheme(const std::string& url, const char* scheme) {
    const std::size_t length = strlen(scheme);
    return url.size() >= length + 3 && strncasecmp(url.c_str(), scheme, length) == 0 &&
           url.compare(length, 3, "://") == 0;
}

}  // namespace

std::unique_ptr<SinkTarget> make_sink_target(const Options& options, std::string* error) {
    if (options.sink == "stdout") return std::make_unique<StdoutTarget>(options.http_timeout);
    if (starts_with_scheme(options.sink, "nats")) return make_nats_target(options, error);
    if (starts_with_scheme(options.sink, "amqp") || starts_with_scheme(options.sink, "amqps"))
        return make_amqp_target(options, error);
    return make_http_target(options, error);
}

}  // namespace idem::relay
