// RabbitMQ closes the channel on a message over its max_message_size
// (406 PRECONDITION_FAILED, "message size N is larger than configured max
// size M"), and so loses the confirms of the whole group: the message of
// that size is the one refused, dead as no retry would change it; the
// others are retried.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace idem::relay {

// N of a channel close's text that refuses a message for its size, or empty.
std::optional<std::size_t> refused_message_size(std::string_view close_text);

}  // namespace idem::relay
