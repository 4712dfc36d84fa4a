// The headers a broker message carries: the relay's own (X-Outbox-Id,
// X-Outbox-Topic, X-Outbox-Key, X-Outbox-Attempt, as the HTTP sink sends
// them) and the event's, under the HTTP sink's rules (none that poses as
// the relay's, none with a control byte) plus the broker's own reserved
// names.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relay/event.hpp"

namespace idem::relay {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The relay's headers of an event, values encoded as for HTTP.
HeaderList relay_headers(const Event& event);

// The event's own headers that may go out; reserved(name) names the
// broker's own. A Content-Type among them comes back in *content_type
// (else it is application/json) and not in the list.
HeaderList event_headers(const Event& event, bool (*reserved)(std::string_view name),
                         std::string* content_type);

}  // namespace idem::relay
