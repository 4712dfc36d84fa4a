// The RabbitMQ sink (amqp://user:password@host:port/vhost?exchange=NAME):
// each event is published to the exchange (default: the default exchange)
// with the topic as routing key, as a persistent message whose message_id
// is its idempotency key, mandatory, on a channel in confirm mode. It is
// acked once the broker confirmed it; a nack, a lost connection or no
// confirm within --http-timeout is retried, and so is a message the broker
// returned as unroutable (no queue bound for its routing key): it stays in
// the outbox, retried with backoff until a queue takes it or it is dead
// after idempotency.outbox_max_attempts. A claim's events go out together
// and their confirms are awaited at once.
#pragma once

#include <memory>
#include <string>

#include "relay/sinks/sink.hpp"

namespace idem::relay {

// nullptr with *error set when the URL is wrong or this build has no AMQP
// client library.
std::unique_ptr<SinkTarget> make_amqp_target(const Options& options, std::string* error);

}  // namespace idem::relay
