#include "relay/options.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace idem::relay {

namespace {

constexpr int kMaxBatch = 10000;
constexpr int kMaxParallel = 256;
constexpr std::size_t kMaxNameBytes = 255;

bool parse_int(const std::string& text, long min, long max, int* out) {
    if (text.empty()) return false;
    char* end = nullptr;
    errno = 0;
    const long value = strtol(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max) return false;
    *out = static_cast<int>(value);
    return true;
}

bool starts_with_nocase(const std::string& text, const char* prefix) {
    return strncasecmp(text.c_str(), prefix, strlen(prefix)) == 0;
}

bool split_topics(const std::string& text, std::vector<std::string>* topics, std::string* error) {
    topics->clear();
    std::size_t start = 0;
    for (;;) {
        const std::size_t comma = text.find(',', start);
        const std::string topic =
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (topic.empty()) {
            *error = "--topics: empty topic name in '" + text + "'";
            return false;
        }
        if (topic.size() > kMaxNameBytes) {
            *error = "--topics: topic '" + topic.substr(0, 40) + "...' is longer than 255 bytes";
            return false;
        }
        topics->push_back(topic);
        if (comma == std::string::npos) return true;
        start = comma + 1;
    }
}

}  // namespace

bool parse_duration(const std::string& text, Millis* out) {
    if (text.empty() || !(isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
        return false;
    char* end = nullptr;
    errno = 0;
    const double number = strtod(text.c_str(), &end);
    if (errno != 0 || end == text.c_str() || !std::isfinite(number) || number < 0) return false;
    const std::string unit(end);
    double scale;
    if (unit.empty() || unit == "s") scale = 1000;
    else if (unit == "ms") scale = 1;
    else if (unit == "m" || unit == "min") scale = 60 * 1000.0;
    else if (unit == "h") scale = 3600 * 1000.0;
    else return false;
    const double ms = number * scale;
    if (ms > 100.0 * 365 * 24 * 3600 * 1000) return false;
    *out = Millis(static_cast<long long>(std::llround(ms)));
    return true;
}

bool parse_loopback_address(const std::string& text, std::string* host, int* port,
                            std::string* error) {
    std::string name, port_text;
    if (!text.empty() && text[0] == '[') {
        const std::size_t close = text.find(']');
        if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
            *error = "expected [ADDRESS]:PORT";
            return false;
        }
        name = text.substr(1, close - 1);
        port_text = text.substr(close + 2);
    } else {
        const std::size_t colon = text.rfind(':');
        if (colon == std::string::npos) {
            *error = "expected HOST:PORT";
            return false;
        }
        name = text.substr(0, colon);
        port_text = text.substr(colon + 1);
    }
    if (!parse_int(port_text, 0, 65535, port)) {
        *error = "the port must be a number from 0 to 65535";
        return false;
    }
    if (name == "localhost") name = "127.0.0.1";
    unsigned char address[16];
    if (inet_pton(AF_INET, name.c_str(), address) == 1) {
        if (address[0] != 127) {
            *error = "the metrics endpoint listens on loopback only (127.0.0.0/8 or ::1), not " + name;
            return false;
        }
    } else if (inet_pton(AF_INET6, name.c_str(), address) == 1) {
        static const unsigned char loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        if (memcmp(address, loopback, sizeof loopback) != 0) {
            *error = "the metrics endpoint listens on loopback only (127.0.0.0/8 or ::1), not " + name;
            return false;
        }
    } else {
        *error = "'" + name + "' is not a numeric loopback address (or localhost)";
        return false;
    }
    *host = name;
    return true;
}

ParseResult parse_options(int argc, const char* const* argv) {
    ParseResult result;
    Options& options = result.options;
    bool has_dsn = false, has_relay = false, has_sink = false;
    bool explicit_http_timeout = false;

    auto fail = [&result](const std::string& message) {
        result.status = ParseStatus::Error;
        result.error = message;
        return result;
    };

    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            result.status = ParseStatus::Help;
            return result;
        }
        if (arg == "--version") {
            result.status = ParseStatus::Version;
            return result;
        }
        if (arg.rfind("--", 0) != 0) return fail("unexpected argument '" + arg + "'");
        std::string name = arg, value;
        bool has_value = false;
        const std::size_t eq = arg.find('=');
        if (eq != std::string::npos) {
            name = arg.substr(0, eq);
            value = arg.substr(eq + 1);
            has_value = true;
        }
        if (name == "--once") {
            if (has_value) return fail("--once takes no value");
            options.once = true;
            continue;
        }
        static const char* const kWithValue[] = {
            "--dsn", "--relay", "--sink", "--topics", "--batch", "--lease", "--parallel",
            "--metrics-addr", "--poll-interval", "--http-timeout", "--connect-timeout",
            "--progress-interval"};
        bool known = false;
        for (const char* option : kWithValue) known = known || name == option;
        if (!known) return fail("unknown option '" + name + "'");
        if (!has_value) {
            if (i + 1 >= argc) return fail(name + " needs a value");
            value = argv[++i];
        }

        if (name == "--dsn") {
            if (value.empty()) return fail("--dsn must not be empty");
            options.dsn = value;
            has_dsn = true;
        } else if (name == "--relay") {
            if (value.empty()) return fail("--relay must not be empty");
            if (value.size() > kMaxNameBytes) return fail("--relay is longer than 255 bytes");
            options.relay = value;
            has_relay = true;
        } else if (name == "--sink") {
            if (value != "stdout" && !starts_with_nocase(value, "http://") &&
                !starts_with_nocase(value, "https://"))
                return fail("--sink must be 'stdout' or an http:// or https:// URL, not '" +
                            value + "'");
            options.sink = value;
            has_sink = true;
        } else if (name == "--topics") {
            std::string error;
            if (!split_topics(value, &options.topics, &error)) return fail(error);
        } else if (name == "--batch") {
            if (!parse_int(value, 1, kMaxBatch, &options.batch))
                return fail("--batch must be a whole number from 1 to 10000, not '" + value + "'");
        } else if (name == "--parallel") {
            if (!parse_int(value, 1, kMaxParallel, &options.parallel))
                return fail("--parallel must be a whole number from 1 to 256, not '" + value + "'");
        } else if (name == "--lease") {
            if (!parse_duration(value, &options.lease) || options.lease.count() < 1)
                return fail("--lease must be a positive duration such as 30s or 500ms, not '" +
                            value + "'");
        } else if (name == "--metrics-addr") {
            std::string error;
            if (!parse_loopback_address(value, &options.metrics_host, &options.metrics_port,
                                        &error))
                return fail("--metrics-addr '" + value + "': " + error);
            options.metrics = true;
        } else if (name == "--poll-interval") {
            if (!parse_duration(value, &options.poll_interval) ||
                options.poll_interval.count() < 1)
                return fail("--poll-interval must be a positive duration, not '" + value + "'");
        } else if (name == "--http-timeout") {
            if (!parse_duration(value, &options.http_timeout) || options.http_timeout.count() < 1)
                return fail("--http-timeout must be a positive duration, not '" + value + "'");
            explicit_http_timeout = true;
        } else if (name == "--connect-timeout") {
            if (!parse_duration(value, &options.connect_timeout) ||
                options.connect_timeout.count() < 1)
                return fail("--connect-timeout must be a positive duration, not '" + value + "'");
        } else if (name == "--progress-interval") {
            if (!parse_duration(value, &options.progress_interval))
                return fail("--progress-interval must be a duration (0 turns it off), not '" +
                            value + "'");
        }
    }

    if (!has_dsn) return fail("--dsn is required");
    if (!has_relay) return fail("--relay is required");
    if (!has_sink) return fail("--sink is required");

    if (!explicit_http_timeout)
        options.http_timeout = std::max(Millis(1), std::min(Millis(10000), options.lease / 3));
    if (options.http_timeout >= options.lease)
        return fail("--http-timeout must be shorter than --lease, or a delivery could outlive "
                    "its lease and be handed to another relay while it runs");
    if (options.connect_timeout.count() == 0)
        options.connect_timeout = std::min(Millis(5000), options.http_timeout);
    if (options.connect_timeout > options.http_timeout)
        options.connect_timeout = options.http_timeout;
    result.status = ParseStatus::Run;
    return result;
}

std::string usage() {
    return R"(idem-relay: delivers the events of the idempotency extension's transactional
outbox (idempotency.outbox_enqueue) to a sink, at least once, in order per key.

Usage:
  idem-relay --dsn DSN --relay NAME --sink SINK [--topics a,b] [--batch N]
             [--lease 30s] [--parallel N] [--once] [--metrics-addr 127.0.0.1:PORT]

Required:
  --dsn DSN            libpq connection string or URI of the database that has the
                       extension, e.g. 'host=/run/postgresql dbname=app user=relay'
                       or postgresql://relay@db/app. The role needs only USAGE on
                       schema idempotency.
  --relay NAME         this relay's name, recorded on the events it claims
                       (1 to 255 bytes)
  --sink SINK          where events go:
                         stdout     one JSON object per line: {"id", "topic", "key",
                                    "headers", "payload", "attempt"}
                         http://... or https://...
                                    POST of the payload (Content-Type:
                                    application/json unless the event's headers
                                    say otherwise) with the headers
                                    Idempotency-Key (the event's dedup_key, or
                                    outbox-<id>), X-Outbox-Id, X-Outbox-Topic,
                                    X-Outbox-Key (keyed events), X-Outbox-Attempt
                                    and the event's own headers.
                                    2xx and 409: delivered (acked).
                                    408, 425, 429, 5xx, timeouts and connection
                                    errors: retried later (nacked as retryable;
                                    a Retry-After header, seconds or HTTP date,
                                    sets the delay; without it the extension's
                                    backoff applies).
                                    Any other status: dead (nacked as final).

Options:
  --topics a,b         deliver only these topics (default: every topic)
  --batch N            events claimed per round trip, 1 to 10000 (default 100);
                       at most N events are in flight at a time
  --lease DURATION     how long a claimed event stays ours before another relay
                       may take it over (default 30s; at most the server's
                       idempotency.max_lease)
  --parallel N         deliveries in progress at once, on N threads (default 1).
                       Events of different keys go out concurrently; an event
                       is never handed out while an earlier event of its
                       (topic, key) is in flight or waiting to retry, so per-key
                       order holds with any N.
  --once               deliver every event that is due now, then exit 0
                       (for scripts and tests)
  --metrics-addr ADDR  serve Prometheus text metrics on http://ADDR/metrics (and
                       a health check on /healthz); ADDR is a loopback address
                       with a port, e.g. 127.0.0.1:9187 (port 0: any free port,
                       logged at start)
  --poll-interval DUR  claim at least this often even without a notification
                       (default 1s); the relay wakes at once on LISTEN
                       idempotency_outbox, polling picks up retries that came
                       due, delayed events and expired leases
  --http-timeout DUR   total time allowed for one HTTP delivery (default the
                       smaller of 10s and a third of --lease; must be shorter
                       than --lease)
  --connect-timeout DUR  time allowed to connect to the HTTP sink (default the
                       smaller of 5s and --http-timeout)
  --progress-interval DUR  how often to print a progress line on stderr
                       (default 10s; 0 turns it off): delivered, retried and
                       dead counts, events in flight, the outbox lag (from
                       idempotency.outbox_lag, when the role may read it) and
                       the longest enqueue-to-delivery delay of the interval
  --help               show this help and exit
  --version            show the version and exit

Durations: a number with ms, s, m or h (a bare number is seconds): 500ms, 30s, 2m.

Behaviour:
  - Delivery is at least once: an event is acked only after the sink accepted
    it. A relay killed mid-delivery leaves its events to come back when their
    lease runs out; a duplicate carries the same Idempotency-Key.
  - When the database goes away the relay reconnects with backoff (100ms
    doubling to 5s) and keeps the outcomes of deliveries made meanwhile, to
    ack or nack them once it is back. Only the first connection must succeed;
    with --once the relay gives up (exit 1) after 30s without a database.
  - SIGTERM or SIGINT: stop claiming, finish the deliveries in flight, ack or
    nack them, exit 0. A second signal abandons events not yet started (their
    leases run out and another relay delivers them).

Exit status: 0 on success (including after SIGTERM/SIGINT), 1 on a runtime
failure (database unreachable at start, extension missing, permission denied,
metrics address in use, stdout closed), 2 on a bad command line.
)";
}

}  // namespace idem::relay
