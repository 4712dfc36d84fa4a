#include "relay/sinks/http_outcome.hpp"

#include <curl/curl.h>

namespace idem::relay {

namespace {

// outbox_nack accepts retry_in up to 100 years.
constexpr std::int64_t kMaxRetryMs = 100LL * 365 * 24 * 3600 * 1000;

std::string_view trim(std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() &&
           (text.back() == ' ' || text.back() == '\t' || text.back() == '\r' || text.back() == '\n'))
        text.remove_suffix(1);
    return text;
}

}  // namespace

std::optional<std::int64_t> parse_retry_after(std::string_view value, std::time_t now) {
    value = trim(value);
    if (value.empty()) return std::nullopt;
    bool digits = true;
    for (const char c : value) digits = digits && c >= '0' && c <= '9';
    if (digits) {
        std::int64_t seconds = 0;
        for (const char c : value) {
            seconds = seconds * 10 + (c - '0');
            if (seconds > kMaxRetryMs / 1000) return kMaxRetryMs;
        }
        return seconds * 1000;
    }
    const std::string text(value);
    const std::time_t when = curl_getdate(text.c_str(), nullptr);
    if (when == -1) return std::nullopt;
    if (when <= now) return 0;
    return std::min<std::int64_t>(static_cast<std::int64_t>(when - now) * 1000, kMaxRetryMs);
}

std::string printable(std::string_view text, std::size_t limit) {
    std::string out;
    for (const char c : text) {
        if (out.size() >= limit) {
            out += "...";
            break;
        }
        const unsigned char u = static_cast<unsigned char>(c);
        if (c == '\n' || c == '\r' || c == '\t') out += ' ';
        else if (u >= 0x20 && u < 0x7f) out += c;
        else out += '?';
    }
    return out;
}

Outcome classify_response(long status, const std::optional<std::int64_t>& retry_after_ms,
                          std::string_view body) {
    if (status >= 200 && status < 300) return Outcome::ack(status);
    std::string error = "HTTP " + std::to_string(status);
    const std::string quoted = printable(trim(body), 200);
    if (!quoted.empty()) error += ": " + quoted;
    // 409: a request with this Idempotency-Key is still in progress at the
    // receiver; it may yet fail, so the event is not delivered until a 2xx.
    if (status == 408 || status == 409 || status == 425 || status == 429 ||
        (status >= 500 && status < 600))
        return Outcome::retry(error, retry_after_ms, status);
    if (status >= 400 && status < 500) return Outcome::dead(error, status);
    // 1xx after the final answer, 3xx (redirects are not followed), or
    // anything outside HTTP: a sink misconfiguration that may be fixed.
    return Outcome::retry(error + " (unexpected status)", retry_after_ms, status);
}

}  // namespace idem::relay
