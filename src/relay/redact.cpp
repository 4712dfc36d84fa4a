#include "relay/redact.hpp"

namespace idem::relay {

namespace {

constexpr std::string_view kHidden = "***";

// user:password@ -> user:***@
std::string redact_authority(std::string_view authority) {
    const std::size_t at = authority.rfind('@');
    if (at == std::string_view::npos) return std::string(authority);
    const std::string_view userinfo = authority.substr(0, at);
    const std::size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) return std::string(authority);
    return std::string(userinfo.substr(0, colon + 1)) + std::string(kHidden) +
           std::string(authority.substr(at));
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
    const std::size_t scheme = url.find("://");
    std::size_t rest = 0;
    if (scheme != std::string_view::npos) {
        rest = scheme + 3;
        const std::size_t authority_end = url.find_first_of("/?#", rest);
        const std::size_t stop = authority_end == std::string_view::npos ? url.size() : authority_end;
        out += url.substr(0, rest);
        out += redact_authority(url.substr(rest, stop - rest));
        rest = stop;
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
