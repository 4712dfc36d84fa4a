// A message's properties, its headers among them, travel in one AMQP
// content-header frame, which may not be larger than the frame size the
// connection negotiated (frame_max; RabbitMQ's default is 128 kB). A
// message whose properties do not fit is never sent, however often it is
// tried: it is dead. The relay checks before it publishes: a publish that
// fails in that frame has already sent the method frame before it, which
// leaves the connection unusable.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idem::relay {

// The sizes, in bytes, of what the relay sets on a message: its content
// type, its message id when set, and its headers, whose values are text or
// 64-bit numbers. The delivery mode and the timestamp are always set.
struct AmqpPropertySizes {
    std::size_t content_type = 0;
    std::optional<std::size_t> message_id;
    std::vector<std::pair<std::size_t, std::size_t>> text_headers;  // name, value
    std::vector<std::size_t> number_headers;                        // name
};

// The bytes of the content-header frame that carries them.
std::size_t content_header_frame_bytes(const AmqpPropertySizes& sizes);

// Why a message with these properties can never be sent on a connection
// whose frame size is frame_max (0: no limit), or empty when it can.
std::optional<std::string> header_frame_refusal(const AmqpPropertySizes& sizes, std::size_t frame_max);

}  // namespace idem::relay
