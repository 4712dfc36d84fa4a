#include "relay/sinks/broker_headers.hpp"

#include <strings.h>

#include "relay/json.hpp"
#include "relay/observe/log.hpp"
#include "relay/sinks/http_headers.hpp"
#include "relay/sinks/http_outcome.hpp"

namespace idem::relay {

HeaderList relay_headers(const Event& event) {
    HeaderList headers;
    headers.emplace_back("X-Outbox-Id", std::to_string(event.id));
    headers.emplace_back("X-Outbox-Topic", encode_header_value(event.topic));
    if (event.key) headers.emplace_back("X-Outbox-Key", encode_header_value(*event.key));
    headers.emplace_back("X-Outbox-Attempt", std::to_string(event.attempt));
    return headers;
}

HeaderList event_headers(const Event& event, bool (*reserved)(std::string_view name),
                         std::string* content_type) {
    HeaderList headers;
    *content_type = "application/json";
    if (!event.headers) return headers;
    JsonMembers members;
    if (!parse_json_object(*event.headers, &members)) {
        log_warning("event %lld: headers are not a JSON object; sent without them",
                    static_cast<long long>(event.id));
        return headers;
    }
    for (auto& [name, value] : members) {
        if (is_reserved_header(name) || reserved(name)) continue;
        if (!is_header_name(name) || !is_header_value(value)) {
            log_warning("event %lld: header '%s' is not a valid header; not sent",
                        static_cast<long long>(event.id), printable(name, 60).c_str());
            continue;
        }
        if (strcasecmp(name.c_str(), "content-type") == 0) {
            *content_type = value;
            continue;
        }
        headers.emplace_back(std::move(name), std::move(value));
    }
    return headers;
}

}  // namespace idem::relay
