// The NATS JetStream sink (nats://host:port[/prefix]): each event is
// published to the subject prefix.topic with its idempotency key as
// Nats-Msg-Id, so that the stream drops a repeat within its duplicate
// window; it is acked once its PubAck came back (a PubAck that says
// duplicate too). A claim's events go out together and their PubAcks are
// awaited at once; an error, a missing PubAck within --http-timeout or a
// lost connection is retried.
#pragma once

#include <memory>
#include <string>

#include "relay/sinks/sink.hpp"

namespace idem::relay {

// nullptr with *error set when the URL is wrong or this build has no NATS
// client library.
std::unique_ptr<SinkTarget> make_nats_target(const Options& options, std::string* error);

}  // namespace idem::relay
