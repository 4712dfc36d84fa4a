#include "relay/sinks/http_sink.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <strings.h>

#include <curl/curl.h>

#include "relay/json.hpp"
#include "relay/observe/log.hpp"
#include "relay/redact.hpp"
#include "relay/sinks/http_headers.hpp"
#include "relay/sinks/http_outcome.hpp"
#include "relay/sinks/sink_fault.hpp"

namespace idem::relay {

namespace {

constexpr std::size_t kBodyQuoteBytes = 512;
// The most of a response body read: its start is quoted in errors, the rest
// is not needed (a longer body ends the transfer, the status stands).
constexpr std::size_t kMaxBodyBytes = 1 << 20;

struct Response {
    std::string body;  // its start
    std::size_t body_bytes = 0;
    std::optional<std::string> retry_after;
    long status = 0;            // of the last status line
    bool headers_done = false;  // the header block of a final (not 1xx) answer ended
    const std::atomic<bool>* aborted = nullptr;
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
    Response* response = static_cast<Response*>(user);
    const size_t bytes = size * count;
    if (response->body.size() < kBodyQuoteBytes)
        response->body.append(data, std::min(bytes, kBodyQuoteBytes - response->body.size()));
    response->body_bytes += bytes;
    return response->body_bytes > kMaxBodyBytes ? 0 : bytes;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
    Response* response = static_cast<Response*>(user);
    const size_t bytes = size * count;
    const std::string_view line(data, bytes);
    static constexpr std::string_view kRetryAfter = "retry-after:";
    if (line.size() >= 5 && line.substr(0, 5) == "HTTP/") {
        // A new status line (after a 100 Continue) starts a new header block.
        response->retry_after.reset();
        response->headers_done = false;
        const std::size_t space = line.find(' ');
        response->status = space == std::string_view::npos ? 0 : atol(std::string(line.substr(space + 1, 3)).c_str());
    } else if (line == "\r\n" || line == "\n") {
        if (response->status >= 200) response->headers_done = true;
    } else if (line.size() > kRetryAfter.size() &&
               strncasecmp(data, kRetryAfter.data(), kRetryAfter.size()) == 0) {
        response->retry_after = std::string(line.substr(kRetryAfter.size()));
    }
    return bytes;
}

// Non-zero ends the transfer: the relay was told to stop at once.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    const Response* response = static_cast<const Response*>(user);
    return response->aborted != nullptr && response->aborted->load() ? 1 : 0;
}

class HttpSink : public Sink {
public:
    HttpSink(const std::string& url, const Options& options, const std::atomic<bool>& aborted,
             SinkFault& fault)
        : url_(url),
          timeout_(options.http_timeout),
          connect_timeout_(options.connect_timeout),
          ca_file_(options.ca_file),
          client_cert_(options.client_cert),
          client_key_(options.client_key),
          aborted_(aborted),
          fault_(fault),
          curl_(curl_easy_init()) {}
    ~HttpSink() override {
        if (curl_ != nullptr) curl_easy_cleanup(curl_);
    }
    HttpSink(const HttpSink&) = delete;
    HttpSink& operator=(const HttpSink&) = delete;

    Outcome deliver(const Event& event) override {
        if (curl_ == nullptr) return Outcome::retry("libcurl: could not create a handle");
        if (fault_.is_set()) return Outcome::skip(fault_.reason());
        curl_slist* headers = build_headers(event);
        Response response;
        response.aborted = &aborted_;
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
        curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, &response);
        curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_buffer);
        curl_easy_setopt(curl_, CURLOPT_USERAGENT, "idem-relay/" IDEM_VERSION);
        curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 0L);
        if (!ca_file_.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, ca_file_.c_str());
        if (!client_cert_.empty()) {
            curl_easy_setopt(curl_, CURLOPT_SSLCERT, client_cert_.c_str());
            curl_easy_setopt(curl_, CURLOPT_SSLKEY,
                             (client_key_.empty() ? client_cert_ : client_key_).c_str());
        }

        const CURLcode code = curl_easy_perform(curl_);
        curl_slist_free_all(headers);
        // Once the status line and headers of the answer arrived, the answer
        // is known: a body that does not end in time, is too long or breaks
        // off does not change it.
        if (code != CURLE_OK && !response.headers_done) {
            std::string error = "HTTP delivery failed: ";
            if (code == CURLE_ABORTED_BY_CALLBACK) error += "the relay was stopped during the delivery";
            else error += error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(code);
            // A certificate the relay does not trust, or certificate files
            // it cannot use: no event can get through, none is charged.
            if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE ||
                code == CURLE_SSL_CERTPROBLEM) {
                fault_.set(printable(error, 300) +
                           (code == CURLE_PEER_FAILED_VERIFICATION
                                ? " (the sink's TLS certificate is not trusted: give its CA with "
                                  "--ca-file)"
                                : " (check --ca-file, --client-cert and --client-key)"));
                return Outcome::skip(fault_.reason());
            }
            return Outcome::retry(printable(error, 300));
        }
        std::optional<std::int64_t> retry_after;
        if (response.retry_after) retry_after = parse_retry_after(*response.retry_after, time(nullptr));
        return classify_response(response.status, retry_after, response.body);
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
                if (is_reserved_header(name)) continue;
                if (!is_header_name(name) || !is_header_value(value)) {
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
        add("Idempotency-Key: " + encode_header_value(event.dedup_key ? *event.dedup_key
                                                                       : "outbox-" + std::to_string(event.id)));
        add("X-Outbox-Id: " + std::to_string(event.id));
        add("X-Outbox-Topic: " + encode_header_value(event.topic));
        if (event.key) add("X-Outbox-Key: " + encode_header_value(*event.key));
        add("X-Outbox-Attempt: " + std::to_string(event.attempt));
        add("Expect:");  // no 100-continue round trip
        return list;
    }

    std::string url_;
    Millis timeout_;
    Millis connect_timeout_;
    std::string ca_file_;
    std::string client_cert_;
    std::string client_key_;
    const std::atomic<bool>& aborted_;
    SinkFault& fault_;
    CURL* curl_;
};

class HttpTarget : public SinkTarget {
public:
    HttpTarget(std::string url, const Options& options)
        : url_(std::move(url)), options_(options), timeout_(options.http_timeout) {}
    std::unique_ptr<Sink> open() override {
        return std::make_unique<HttpSink>(url_, options_, aborted_, fault_);
    }
    std::string fatal_error() const override { return fault_.reason(); }
    Millis max_delivery_time() const override { return timeout_; }
    void abort() override { aborted_ = true; }
    std::string describe() const override { return "POST " + redact_url(url_); }

private:
    std::string url_;
    Options options_;
    Millis timeout_;
    std::atomic<bool> aborted_{false};
    SinkFault fault_;
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
        *error = "--sink '" + redact_url(options.sink) + "' is not a valid URL" +
                 (code != CURLUE_OK ? std::string(" (") + curl_url_strerror(code) + ")" : "");
        return nullptr;
    }
    const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
    if (strncasecmp(options.sink.c_str(), "https://", 8) == 0 &&
        (info == nullptr || (info->features & CURL_VERSION_SSL) == 0)) {
        *error = "--sink is an https:// URL but this libcurl has no TLS support";
        return nullptr;
    }
    return std::make_unique<HttpTarget>(options.sink, options);
}

}  // namespace idem::relay
