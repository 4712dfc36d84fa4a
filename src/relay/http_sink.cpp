#include "relay/http_sink.hpp"

#include <cctype>
#include <cstring>
#include <ctime>
#include <strings.h>

#include <curl/curl.h>

#include "relay/http_outcome.hpp"
#include "relay/json.hpp"
#include "relay/log.hpp"

namespace idem::relay {

namespace {

constexpr std::size_t kBodyQuoteBytes = 512;

// Headers the relay sets itself; an event's header of the same name is dropped.
const char* const kReservedHeaders[] = {
    "idempotency-key", "x-outbox-id", "x-outbox-topic", "x-outbox-key", "x-outbox-attempt",
    "content-length", "transfer-encoding", "host", "connection", "expect"};

bool is_token(const std::string& name) {
    if (name.empty()) return false;
    for (const char c : name) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (isalnum(u)) continue;
        if (!strchr("!#$%&'*+-.^_`|~", c)) return false;
    }
    return true;
}

bool is_safe_value(const std::string& value) {
    for (const char c : value)
        if (c == '\r' || c == '\n' || c == '\0') return false;
    return true;
}

// A value of the relay's own headers: control bytes percent-encoded, so a
// topic or key can never split a header.
std::string header_value(std::string_view value) {
    std::string out;
    for (const char c : value) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            char escaped[4];
            snprintf(escaped, sizeof escaped, "%%%02X", u);
            out += escaped;
        } else {
            out += c;
        }
    }
    return out;
}

struct Response {
    std::string body;
    std::optional<std::string> retry_after;
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
    Response* response = static_cast<Response*>(user);
    const size_t bytes = size * count;
    if (response->body.size() < kBodyQuoteBytes)
        response->body.append(data, std::min(bytes, kBodyQuoteBytes - response->body.size()));
    return bytes;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
    Response* response = static_cast<Response*>(user);
    const size_t bytes = size * count;
    static const char kName[] = "retry-after:";
    if (bytes > sizeof kName - 1 && strncasecmp(data, kName, sizeof kName - 1) == 0)
        response->retry_after = std::string(data + sizeof kName - 1, bytes - (sizeof kName - 1));
    // A new status line (after a 100 Continue) starts a new header block.
    if (bytes >= 5 && strncmp(data, "HTTP/", 5) == 0) response->retry_after.reset();
    return bytes;
}

class HttpSink : public Sink {
public:
    HttpSink(const std::string& url, Millis timeout, Millis connect_timeout)
        : url_(url), timeout_(timeout), connect_timeout_(connect_timeout), curl_(curl_easy_init()) {}
    ~HttpSink() override {
        if (curl_ != nullptr) curl_easy_cleanup(curl_);
    }
    HttpSink(const HttpSink&) = delete;
    HttpSink& operator=(const HttpSink&) = delete;

    Outcome deliver(const Event& event) override {
        if (curl_ == nullptr) return Outcome::retry("libcurl: could not create a handle");
        curl_slist* headers = build_headers(event);
        Response response;
        char error_buffer[CURL_ERROR_SIZE] = "";

        // The handle is reused so that connections are kept alive.
        curl_easy_reset(curl_);
        curl_easy_setopt(curl_, CURLOPT_URL, url_.c_str());
        curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl_, CURLOPT_POST, 1L);
        curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, event.payload.data());
        curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE,
                         static_cast<curl_off_t>(event.payload.size()));
        curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
        curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS,
                         static_cast<long>(connect_timeout_.count()));
        curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &response);
        curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &response);
        curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_buffer);
        curl_easy_setopt(curl_, CURLOPT_USERAGENT, "idem-relay/0.1.0");
        curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 0L);

        const CURLcode code = curl_easy_perform(curl_);
        curl_slist_free_all(headers);
        if (code != CURLE_OK) {
            std::string error = "HTTP delivery failed: ";
            error += error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(code);
            return Outcome::retry(printable(error, 300));
        }
        long status = 0;
        curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
        std::optional<std::int64_t> retry_after;
        if (response.retry_after) retry_after = parse_retry_after(*response.retry_after, time(nullptr));
        return classify_response(status, retry_after, response.body);
    }

private:
    curl_slist* build_headers(const Event& event) {
        curl_slist* list = nullptr;
        auto add = [&list](const std::string& line) {
            curl_slist* next = curl_slist_append(list, line.c_str());
            if (next != nullptr) list = next;
        };
        bool content_type = false;
        if (event.headers) {
            JsonMembers members;
            if (!parse_json_object(*event.headers, &members)) {
                log_warning("event %lld: headers are not a JSON object; sent without them",
                            static_cast<long long>(event.id));
            }
            for (const auto& [name, value] : members) {
                bool reserved = false;
                for (const char* r : kReservedHeaders) reserved = reserved || strcasecmp(name.c_str(), r) == 0;
                if (reserved) continue;
                if (!is_token(name) || !is_safe_value(value)) {
                    log_warning("event %lld: header '%s' is not a valid HTTP header; not sent",
                                static_cast<long long>(event.id), printable(name, 60).c_str());
                    continue;
                }
                if (strcasecmp(name.c_str(), "content-type") == 0) content_type = true;
                // "Name;" is curl's way to send a header with an empty value.
                add(value.empty() ? name + ";" : name + ": " + value);
            }
        }
        if (!content_type) add("Content-Type: application/json");
        add("Idempotency-Key: " +
            header_value(event.dedup_key ? *event.dedup_key : "outbox-" + std::to_string(event.id)));
        add("X-Outbox-Id: " + std::to_string(event.id));
        add("X-Outbox-Topic: " + header_value(event.topic));
        if (event.key) add("X-Outbox-Key: " + header_value(*event.key));
        add("X-Outbox-Attempt: " + std::to_string(event.attempt));
        add("Expect:");  // no 100-continue round trip
        return list;
    }

    std::string url_;
    Millis timeout_;
    Millis connect_timeout_;
    CURL* curl_;
};

class HttpTarget : public SinkTarget {
public:
    HttpTarget(std::string url, Millis timeout, Millis connect_timeout)
        : url_(std::move(url)), timeout_(timeout), connect_timeout_(connect_timeout) {}
    std::unique_ptr<Sink> open() override {
        return std::make_unique<HttpSink>(url_, timeout_, connect_timeout_);
    }
    Millis max_delivery_time() const override { return timeout_; }
    std::string describe() const override { return "POST " + shown_url_(); }

private:
    // The URL without any user:password part.
    std::string shown_url_() const {
        CURLU* handle = curl_url();
        std::string shown = url_;
        if (handle != nullptr && curl_url_set(handle, CURLUPART_URL, url_.c_str(), 0) == CURLUE_OK) {
            curl_url_set(handle, CURLUPART_USER, nullptr, 0);
            curl_url_set(handle, CURLUPART_PASSWORD, nullptr, 0);
            char* text = nullptr;
            if (curl_url_get(handle, CURLUPART_URL, &text, 0) == CURLUE_OK) {
                shown = text;
                curl_free(text);
            }
        }
        if (handle != nullptr) curl_url_cleanup(handle);
        return shown;
    }

    std::string url_;
    Millis timeout_;
    Millis connect_timeout_;
};

}  // namespace

std::unique_ptr<SinkTarget> make_http_target(const Options& options, std::string* error) {
    CURLU* handle = curl_url();
    if (handle == nullptr) {
        *error = "libcurl: out of memory";
        return nullptr;
    }
    const CURLUcode code = curl_url_set(handle, CURLUPART_URL, options.sink.c_str(), 0);
    char* host = nullptr;
    const bool has_host = code == CURLUE_OK &&
                          curl_url_get(handle, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
                          host != nullptr && host[0] != '\0';
    if (host != nullptr) curl_free(host);
    curl_url_cleanup(handle);
    if (code != CURLUE_OK || !has_host) {
        *error = "--sink '" + options.sink + "' is not a valid URL" +
                 (code != CURLUE_OK ? std::string(" (") + curl_url_strerror(code) + ")" : "");
        return nullptr;
    }
    const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
    if (strncasecmp(options.sink.c_str(), "https://", 8) == 0 &&
        (info == nullptr || (info->features & CURL_VERSION_SSL) == 0)) {
        *error = "--sink is an https:// URL but this libcurl has no TLS support";
        return nullptr;
    }
    return std::make_unique<HttpTarget>(options.sink, options.http_timeout,
                                         options.connect_timeout);
}

}  // namespace idem::relay
