#include "relay/sinks/sink.hpp"

#include <cstring>
#include <strings.h>

#include "relay/sinks/amqp_sink.hpp"
#include "relay/sinks/http_sink.hpp"
#include "relay/sinks/nats_sink.hpp"
#include "relay/redact.hpp"
#include "relay/sinks/stdout_sink.hpp"

namespace idem::relay {

namespace {

bool starts_with_scheme(const std::string& url, const char* scheme) {
    const std::size_t length = strlen(scheme);
    return url.size() >= length + 3 && strncasecmp(url.c_str(), scheme, length) == 0 &&
           url.compare(length, 3, "://") == 0;
}

}  // namespace

void Sink::deliver_group(const std::vector<const Event*>& events, std::vector<Outcome>* outcomes) {
    outcomes->clear();
    outcomes->reserve(events.size());
    for (const Event* event : events) outcomes->push_back(deliver(*event));
}

Outcome GroupSink::deliver(const Event& event) {
    std::vector<Outcome> outcomes;
    deliver_group({&event}, &outcomes);
    return outcomes.front();
}

std::unique_ptr<SinkTarget> sink_not_built(const Options& options, const char* what,
                                           const char* package, std::string* error) {
    *error = "--sink '" + redact_url(options.sink) + "': this idem-relay was built without " +
             what + " support (build it with " + package + " installed)";
    return nullptr;
}

std::unique_ptr<SinkTarget> make_sink_target(const Options& options, std::string* error) {
    if (options.sink == "stdout") return std::make_unique<StdoutTarget>(options.http_timeout);
    if (starts_with_scheme(options.sink, "nats")) return make_nats_target(options, error);
    if (starts_with_scheme(options.sink, "amqp") || starts_with_scheme(options.sink, "amqps"))
        return make_amqp_target(options, error);
    return make_http_target(options, error);
}

}  // namespace idem::relay
