#include "relay/redact.hpp"

#include <cctype>

namespace idem::relay {

namespace {

constexpr std::string_view kHidden = "***";

// user:password@ -> ***:***@, token@ -> ***@: a user name may be the
// secret itself (a bearer token as the URL's user, NATS's token@host).
// One host of a list (host1,host2) at a time.
std::string redact_host(std::string_view host) {
    const std::size_t at = host.rfind('@');
    if (at == std::string_view::npos) return std::string(host);
    std::string out(kHidden);
    if (host.substr(0, at).find(':') != std::string_view::npos) {
        out += ':';
        out += kHidden;
    }
    out += host.substr(at);
    return out;
}

std::string redact_authority(std::string_view authority) {
    std::string out;
    std::size_t start = 0;
    for (;;) {
        const std::size_t comma = authority.find(',', start);
        out += redact_host(authority.substr(
            start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
        if (comma == std::string_view::npos) return out;
        out += ',';
        start = comma + 1;
    }
}

// At i a list's next URL begins: ",scheme://".
bool next_url_at(std::string_view url, std::size_t i) {
    if (url[i] != ',') return false;
    std::size_t j = i + 1;
    while (j < url.size() && isalpha(static_cast<unsigned char>(url[j]))) ++j;
    return j > i + 1 && url.substr(j, 3) == "://";
}

// a=1&b -> a=***&b
std::string redact_query(std::string_view query) {
    std::string out;
    std::size_t start = 0;
    for (;;) {
        const std::size_t end = query.find('&', start);
        const std::string_view part =
            query.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
        const std::size_t eq = part.find('=');
        if (eq == std::string_view::npos) {
            out += part;
        } else {
            out += part.substr(0, eq + 1);
            out += kHidden;
        }
        if (end == std::string_view::npos) return out;
        out += '&';
        start = end + 1;
    }
}

}  // namespace

std::string redact_url(std::string_view url) {
    std::string out;
    std::size_t rest = 0;
    // Each URL of a comma-separated list (NATS's servers) has its userinfo.
    for (std::size_t scheme; (scheme = url.find("://", rest)) != std::string_view::npos;) {
        const std::size_t begin = scheme + 3;
        std::size_t stop = begin;
        while (stop < url.size() && url[stop] != '/' && url[stop] != '?' && url[stop] != '#' &&
               !next_url_at(url, stop))
            ++stop;
        out += url.substr(rest, begin - rest);
        out += redact_authority(url.substr(begin, stop - begin));
        rest = stop;
        if (stop >= url.size() || url[stop] != ',') break;
    }
    const std::size_t question = url.find('?', rest);
    if (question == std::string_view::npos) {
        out += url.substr(rest);
        return out;
    }
    const std::size_t hash = url.find('#', question);
    out += url.substr(rest, question + 1 - rest);
    out += redact_query(url.substr(question + 1, hash == std::string_view::npos
                                                     ? std::string_view::npos
                                                     : hash - question - 1));
    if (hash != std::string_view::npos) out += url.substr(hash);
    return out;
}

}  // namespace idem::relay
