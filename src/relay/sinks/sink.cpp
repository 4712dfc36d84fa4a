#include "relay/sinks/sink.hpp"

#include "relay/redact.hpp"

namespace idem::relay {

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

}  // namespace idem::relay
