// What a nats:// or amqp:// sink URL says, and the names events get there:
// plain parsing, no broker library.
#pragma once

#include <string>
#include <vector>

#include "relay/event.hpp"

namespace idem::relay {

// nats://[user[:password]@]host[:port][,host[:port]...][/prefix]
struct NatsAddress {
    std::vector<std::string> servers;  // a nats://[user[:password]@]host[:port] URL each
    std::string prefix;                // subjects are prefix.topic ("" : the topic alone)
};
bool parse_nats_url(const std::string& url, NatsAddress* address, std::string* error);

// The subject of a topic: prefix.topic, with the bytes a subject may not
// hold (space, control bytes, '*', '>', and '%' itself) written as %XX.
// False when a token would be empty (a topic that starts or ends with '.'
// or holds "..").
bool nats_subject(const std::string& prefix, const std::string& topic, std::string* subject,
                  std::string* error);

// amqp[s]://[user[:password]@]host[:port][/vhost][?exchange=NAME], percent-
// encoded as URIs are: the default vhost is "/" (written %2F in a URL);
// amqps:// is over TLS (port 5671 by default).
struct AmqpAddress {
    std::string host;
    int port = 5672;
    std::string user = "guest";
    std::string password = "guest";
    std::string vhost = "/";
    std::string exchange;  // "" : the default exchange (routing key = queue name)
    bool tls = false;      // amqps://
};
bool parse_amqp_url(const std::string& url, AmqpAddress* address, std::string* error);

// The event's idempotency key, as every sink sends it: its dedup_key, or
// outbox-<id>.
std::string idempotency_key(const Event& event);

// The Nats-Msg-Id of an event published to subject. JetStream drops a
// message whose id it holds anywhere in the stream, and one stream may take
// several topics (and several databases' outboxes, each under its own
// prefix), whose idempotency keys are unique within their topic only: the
// subject, a space (never in a subject), then the key as a header value.
std::string nats_message_id(const std::string& subject, const Event& event);

}  // namespace idem::relay
