#include "relay/sinks/broker_address.hpp"

#include "relay/sinks/http_headers.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

namespace idem::relay {

namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool percent_decode(const std::string& text, std::string* out) {
    out->clear();
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            *out += text[i];
            continue;
        }
        if (i + 2 >= text.size()) return false;
        const int high = hex_value(text[i + 1]), low = hex_value(text[i + 2]);
        if (high < 0 || low < 0) return false;
        *out += static_cast<char>(high * 16 + low);
        i += 2;
    }
    return true;
}

// "scheme://" stripped, or false.
bool after_scheme(const std::string& url, const char* scheme, std::string* rest) {
    const std::size_t length = strlen(scheme);
    if (url.size() < length + 3 || strncasecmp(url.c_str(), scheme, length) != 0 ||
        url.compare(length, 3, "://") != 0)
        return false;
    *rest = url.substr(length + 3);
    return true;
}

// host[:port] or [address][:port]: the host, and the port (0 when none is
// given); false, saying why, when either is not one.
bool parse_host_port(const std::string& authority, std::string* host, int* port, std::string* error) {
    std::string port_text;
    bool port_given = false;
    if (!authority.empty() && authority[0] == '[') {
        const std::size_t close = authority.find(']');
        if (close == std::string::npos) {
            *error = "an unclosed [ in the host";
            return false;
        }
        *host = authority.substr(1, close - 1);
        if (close + 1 < authority.size()) {
            if (authority[close + 1] != ':') {
                *error = "expected [address]:port";
                return false;
            }
            port_text = authority.substr(close + 2);
            port_given = true;
        }
    } else {
        const std::size_t colon = authority.find(':');
        *host = authority.substr(0, colon);
        port_given = colon != std::string::npos;
        if (port_given) port_text = authority.substr(colon + 1);
    }
    if (host->empty()) {
        *error = "no host";
        return false;
    }
    *port = 0;
    if (port_given) {
        char* end = nullptr;
        const long value = strtol(port_text.c_str(), &end, 10);
        if (*end != '\0' || value < 1 || value > 65535) {
            *error = "the port must be a number from 1 to 65535";
            return false;
        }
        *port = static_cast<int>(value);
    }
    return true;
}

}  // namespace

bool parse_nats_url(const std::string& url, NatsAddress* address, std::string* error) {
    std::string rest;
    if (!after_scheme(url, "nats", &rest)) {
        *error = "expected nats://host[:port][/prefix]";
        return false;
    }
    const std::size_t slash = rest.find('/');
    const std::string hosts = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (hosts.empty() || hosts.find_first_of("?#") != std::string::npos ||
        prefix.find_first_of("?#") != std::string::npos) {
        *error = "expected nats://host[:port][/prefix] (no query)";
        return false;
    }
    while (!prefix.empty() && prefix.back() == '.') prefix.pop_back();
    std::string subject;
    if (!prefix.empty() && (!nats_subject("", prefix, &subject, error) || subject != prefix)) {
        *error = "the subject prefix '" + prefix + "' is not a plain subject (tokens of "
                 "anything but spaces, '*', '>' and '%', separated by '.')";
        return false;
    }
    // Every server of the list is a URL of its own for the client, with the
    // list's user and password (written once, before the first server).
    const std::size_t at = hosts.rfind('@');
    const std::string userinfo = at == std::string::npos ? "" : hosts.substr(0, at + 1);
    std::vector<std::string> servers;
    std::size_t start = at == std::string::npos ? 0 : at + 1;
    for (;;) {
        const std::size_t comma = hosts.find(',', start);
        const std::string server = hosts.substr(start, comma == std::string::npos ? comma : comma - start);
        if (server.empty()) {
            *error = "an empty server in the list";
            return false;
        }
        std::string host, why;
        int port = 0;
        if (!parse_host_port(server, &host, &port, &why)) {
            *error = "server '" + server + "': " + why;
            return false;
        }
        servers.push_back("nats://" + userinfo + server);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    address->servers = servers;
    address->prefix = prefix;
    return true;
}

bool nats_subject(const std::string& prefix, const std::string& topic, std::string* subject,
                  std::string* error) {
    std::string out = prefix.empty() ? "" : prefix + ".";
    bool token_empty = true;
    for (const char c : topic) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (c == '.') {
            if (token_empty) break;
            token_empty = true;
            out += c;
            continue;
        }
        token_empty = false;
        if (u <= 0x20 || u == 0x7f || c == '*' || c == '>' || c == '%') {
            char escaped[4];
            snprintf(escaped, sizeof escaped, "%%%02X", u);
            out += escaped;
        } else {
            out += c;
        }
    }
    if (token_empty) {
        *error = "topic '" + topic + "' gives an empty subject token (a '.' at an end or \"..\")";
        return false;
    }
    *subject = std::move(out);
    return true;
}

bool parse_amqp_url(const std::string& url, AmqpAddress* address, std::string* error) {
    std::string rest;
    const bool tls = after_scheme(url, "amqps", &rest);
    if (!tls && !after_scheme(url, "amqp", &rest)) {
        *error = "expected amqp[s]://[user:password@]host[:port][/vhost][?exchange=NAME]";
        return false;
    }
    AmqpAddress parsed;
    parsed.tls = tls;
    parsed.port = tls ? 5671 : 5672;
    std::string query;
    const std::size_t question = rest.find('?');
    if (question != std::string::npos) {
        query = rest.substr(question + 1);
        rest.resize(question);
    }
    const std::size_t slash = rest.find('/');
    std::string authority = rest.substr(0, slash);
    if (slash != std::string::npos && slash + 1 < rest.size() &&
        !percent_decode(rest.substr(slash + 1), &parsed.vhost)) {
        *error = "the vhost is not percent-encoded properly";
        return false;
    }
    const std::size_t at = authority.rfind('@');
    if (at != std::string::npos) {
        const std::string userinfo = authority.substr(0, at);
        authority = authority.substr(at + 1);
        const std::size_t colon = userinfo.find(':');
        if (!percent_decode(userinfo.substr(0, colon), &parsed.user) ||
            (colon != std::string::npos &&
             !percent_decode(userinfo.substr(colon + 1), &parsed.password))) {
            *error = "the user or password is not percent-encoded properly";
            return false;
        }
        if (colon == std::string::npos) parsed.password.clear();
    }
    int port = 0;
    if (!parse_host_port(authority, &parsed.host, &port, error)) return false;
    if (port != 0) parsed.port = port;
    std::size_t start = 0;
    while (start < query.size()) {
        const std::size_t amp = query.find('&', start);
        const std::string pair = query.substr(start, amp == std::string::npos ? amp : amp - start);
        const std::size_t eq = pair.find('=');
        const std::string name = pair.substr(0, eq);
        std::string value;
        if (eq == std::string::npos || !percent_decode(pair.substr(eq + 1), &value)) {
            *error = "query parameter '" + name + "' needs a percent-encoded value";
            return false;
        }
        if (name != "exchange") {
            *error = "unknown query parameter '" + name + "' (only exchange=NAME)";
            return false;
        }
        parsed.exchange = value;
        if (amp == std::string::npos) break;
        start = amp + 1;
    }
    *address = parsed;
    return true;
}

std::string idempotency_key(const Event& event) {
    return event.dedup_key ? *event.dedup_key : "outbox-" + std::to_string(event.id);
}

std::string nats_message_id(const std::string& subject, const Event& event) {
    return encode_header_value(subject) + " " + encode_header_value(idempotency_key(event));
}

}  // namespace idem::relay
