#include "relay/sinks/amqp_size_refusal.hpp"

#include <cctype>

namespace idem::relay {

std::optional<std::size_t> refused_message_size(std::string_view close_text) {
    constexpr std::string_view before = "message size ";
    constexpr std::string_view after = " is larger than configured max size";
    const std::size_t start = close_text.find(before);
    if (start == std::string_view::npos) return {};
    std::size_t at = start + before.size(), size = 0, digits = 0;
    for (; at < close_text.size() && std::isdigit(static_cast<unsigned char>(close_text[at])); ++at, ++digits) {
        if (size > (static_cast<std::size_t>(-1) - 9) / 10) return {};
        size = size * 10 + static_cast<std::size_t>(close_text[at] - '0');
    }
    if (digits == 0 || close_text.substr(at, after.size()) != after) return {};
    return size;
}

}  // namespace idem::relay
