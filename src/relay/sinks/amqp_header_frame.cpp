#include "relay/sinks/amqp_header_frame.hpp"

namespace idem::relay {

namespace {

// AMQP 0-9-1's framing: a frame is its type (1), channel (2), payload size
// (4), the payload and an end octet (1); a content header's payload is its
// class (2), weight (2), body size (8), property flags (2) and the
// properties that are set, a short string taking one octet of length.
constexpr std::size_t kFrameOverhead = 1 + 2 + 4 + 1;
constexpr std::size_t kContentHeaderFixed = 2 + 2 + 8 + 2;
constexpr std::size_t kDeliveryMode = 1;
constexpr std::size_t kTimestamp = 8;

std::size_t short_string(std::size_t bytes) { return 1 + bytes; }

}  // namespace

std::size_t content_header_frame_bytes(const AmqpPropertySizes& sizes) {
    std::size_t table = 4;  // its length
    for (const auto& [name, value] : sizes.text_headers) table += short_string(name) + 1 + 4 + value;
    for (std::size_t name : sizes.number_headers) table += short_string(name) + 1 + 8;
    std::size_t payload = kContentHeaderFixed + short_string(sizes.content_type) + table + kDeliveryMode + kTimestamp;
    if (sizes.message_id) payload += short_string(*sizes.message_id);
    return kFrameOverhead + payload;
}

std::optional<std::string> header_frame_refusal(const AmqpPropertySizes& sizes, std::size_t frame_max) {
    const std::size_t bytes = content_header_frame_bytes(sizes);
    if (frame_max == 0 || bytes <= frame_max) return {};
    return "its headers take " + std::to_string(bytes) + " bytes, more than the " + std::to_string(frame_max) +
           "-byte AMQP frame the broker allows (frame_max)";
}

}  // namespace idem::relay
