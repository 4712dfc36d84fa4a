#include "relay/sinks/http_headers.hpp"

#include <cctype>
#include <cstdio>
#include <cstring>

namespace idem::relay {

namespace {

const char* const kReservedHeaders[] = {
    "idempotency-key", "x-outbox-id", "x-outbox-topic", "x-outbox-key", "x-outbox-attempt",
    "content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te",
    "trailer", "keep-alive", "proxy-connection"};

}  // namespace

std::string encode_header_value(std::string_view value) {
    std::string out;
    out.reserve(value.size());
    for (const char c : value) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u >= 0x7f || c == '%') {
            char escaped[4];
            snprintf(escaped, sizeof escaped, "%%%02X", u);
            out += escaped;
        } else {
            out += c;
        }
    }
    return out;
}

bool is_reserved_header(std::string_view name) {
    std::string folded;
    folded.reserve(name.size());
    for (const char c : name)
        folded += c == '_' ? '-' : static_cast<char>(tolower(static_cast<unsigned char>(c)));
    for (const char* reserved : kReservedHeaders)
        if (folded == reserved) return true;
    return false;
}

bool is_header_name(std::string_view name) {
    if (name.empty()) return false;
    for (const char c : name) {
        if (isalnum(static_cast<unsigned char>(c))) continue;
        if (c == '\0' || !strchr("!#$%&'*+-.^_`|~", c)) return false;
    }
    return true;
}

bool is_header_value(std::string_view value) {
    for (const char c : value) {
        const unsigned char u = static_cast<unsigned char>(c);
        if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
    }
    return true;
}

}  // namespace idem::relay
