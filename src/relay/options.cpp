#include "relay/options.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "relay/redact.hpp"

namespace idem::relay {

namespace {

constexpr int kMaxBatch = 10000;
constexpr int kMaxParallel = 256;
constexpr int kMaxConnections = 16;
// A shorter lease ends before a claim's round trip does; and the server ends
// the relay's claim transaction once it has been idle that long.
constexpr Millis kMinLease{100};
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

std::string trimmed(const std::string& text) {
    const std::size_t first = text.find_first_not_of(" \t");
    if (first == std::string::npos) return "";
    return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// "a, b" is a and b: spaces around the commas are not part of the names.
bool split_topics(const std::string& text, std::vector<std::string>* topics, std::string* error) {
    topics->clear();
    std::size_t start = 0;
    for (;;) {
        const std::size_t comma = text.find(',', start);
        const std::string topic = trimmed(
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
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

// The sink URL (a secret, often) from where it is kept off the command line:
// --sink-file FILE holds it alone (one line; surrounding blanks and the line
// end dropped).
bool read_sink_file(const std::string& path, std::string* sink, std::string* error) {
    FILE* file = fopen(path.c_str(), "re");
    if (file == nullptr) {
        *error = "--sink-file: cannot read '" + path + "': " + strerror(errno);
        return false;
    }
    std::string text;
    char buffer[4096];
    std::size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, file)) > 0 && text.size() < 65536)
        text.append(buffer, n);
    const bool failed = ferror(file) != 0;
    fclose(file);
    if (failed) {
        *error = "--sink-file: cannot read '" + path + "'";
        return false;
    }
    const std::size_t first = text.find_first_not_of(" \t\r\n");
    const std::size_t last = text.find_last_not_of(" \t\r\n");
    text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
    if (text.empty()) {
        *error = "--sink-file: '" + path + "' is empty";
        return false;
    }
    if (text.find_first_of("\r\n") != std::string::npos) {
        *error = "--sink-file: '" + path + "' must hold one line, the sink";
        return false;
    }
    *sink = text;
    return true;
}

bool valid_sink(const std::string& value) {
    return value == "stdout" || starts_with_nocase(value, "http://") ||
           starts_with_nocase(value, "https://") || starts_with_nocase(value, "nats://") ||
           starts_with_nocase(value, "amqp://") || starts_with_nocase(value, "amqps://");
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

bool parse_size(const std::string& text, std::int64_t* out) {
    if (text.empty() || !isdigit(static_cast<unsigned char>(text[0]))) return false;
    char* end = nullptr;
    errno = 0;
    const unsigned long long number = strtoull(text.c_str(), &end, 10);
    if (errno != 0) return false;
    std::string unit(end);
    for (char& c : unit) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    int shift;
    if (unit.empty() || unit == "b") shift = 0;
    else if (unit == "k" || unit == "kb") shift = 10;
    else if (unit == "m" || unit == "mb") shift = 20;
    else if (unit == "g" || unit == "gb") shift = 30;
    else return false;
    if (number > (static_cast<unsigned long long>(INT64_MAX) >> shift)) return false;
    *out = static_cast<std::int64_t>(number << shift);
    return true;
}

bool parse_listen_address(const std::string& text, std::string* host, int* port,
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
    // ":9187" listens on every IPv4 address.
    if (name.empty()) name = "0.0.0.0";
    unsigned char address[16];
    if (inet_pton(AF_INET, name.c_str(), address) == 1 ||
        inet_pton(AF_INET6, name.c_str(), address) == 1) {
        *host = name;
        return true;
    }
    // A host name (the container's own, localhost): its first address.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* found = nullptr;
    const int status = getaddrinfo(name.c_str(), nullptr, &hints, &found);
    if (status != 0 || found == nullptr) {
        *error = "cannot resolve '" + name + "': " + gai_strerror(status);
        return false;
    }
    char numeric[INET6_ADDRSTRLEN] = "";
    const void* where =
        found->ai_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
    inet_ntop(found->ai_family, where, numeric, sizeof numeric);
    freeaddrinfo(found);
    *host = numeric;
    return true;
}

ParseResult parse_options(int argc, const char* const* argv) {
    ParseResult result;
    Options& options = result.options;
    bool has_relay = false, has_sink = false, has_topics = false, has_dsn = false;
    std::string sink_from;  // the option that gave the sink
    bool explicit_http_timeout = false;
    std::set<std::string> given;  // the options with a value seen so far

    auto fail = [&result](const std::string& message) {
        result.status = ParseStatus::Error;
        result.error = message;
        return result;
    };
    // Refuses duration option `name`: what it must be, and how one is written.
    auto bad_duration = [&fail](const std::string& name, const char* rule,
                                const std::string& value) {
        return fail(name + " must be " + rule +
                    " (a number with ms, s, min or h, at most 100 years), not '" + value + "'");
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
        if (name == "--once" || name == "--all-topics") {
            if (has_value) return fail(name + " takes no value");
            if (name == "--once") options.once = true;
            else options.all_topics = true;
            continue;
        }
        static const char* const kWithValue[] = {
            "--dsn", "--relay", "--sink", "--sink-file", "--topics", "--batch", "--run-length",
            "--lease", "--parallel", "--connections", "--metrics-addr", "--poll-interval",
            "--http-timeout", "--connect-timeout", "--progress-interval", "--max-in-flight-bytes",
            "--maintenance-interval",
            "--ca-file", "--client-cert", "--client-key"};
        bool known = false;
        for (const char* option : kWithValue) known = known || name == option;
        if (!known) return fail("unknown option '" + name + "'");
        // A second value would silently replace the first (a second
        // --topics list, or a --relay name that differs from a unit's).
        if (!given.insert(name).second && name != "--sink" && name != "--sink-file")
            return fail(name + " is given twice" +
                        (name == "--topics" ? ": name every topic in one comma-separated list"
                                            : std::string(": give it once")));
        if (!has_value) {
            if (i + 1 >= argc) return fail(name + " needs a value");
            value = argv[++i];
        }

        if (name == "--dsn") {
            options.dsn = value;
            has_dsn = true;
        } else if (name == "--relay") {
            if (value.empty()) return fail("--relay must not be empty");
            if (value.size() > kMaxNameBytes) return fail("--relay is longer than 255 bytes");
            options.relay = value;
            has_relay = true;
        } else if (name == "--sink" || name == "--sink-file") {
            if (has_sink) return fail(name + ": the sink is given already (by " + sink_from + ")");
            if (name == "--sink-file") {
                std::string error;
                if (!read_sink_file(value, &value, &error)) return fail(error);
            }
            if (!valid_sink(value))
                return fail(name + " must be 'stdout' or an http://, https://, nats:// or amqp:// "
                            "URL, not '" + redact_url(value) + "'");
            options.sink = value;
            has_sink = true;
            sink_from = name;
        } else if (name == "--topics") {
            std::string error;
            if (!split_topics(value, &options.topics, &error)) return fail(error);
            has_topics = true;
        } else if (name == "--batch") {
            if (!parse_int(value, 1, kMaxBatch, &options.batch))
                return fail("--batch must be a whole number from 1 to 10000, not '" + value + "'");
        } else if (name == "--run-length") {
            if (!parse_int(value, 1, kMaxBatch, &options.run_length))
                return fail("--run-length must be a whole number from 1 to 10000, not '" + value +
                            "'");
        } else if (name == "--parallel") {
            if (!parse_int(value, 1, kMaxParallel, &options.parallel))
                return fail("--parallel must be a whole number from 1 to 256, not '" + value + "'");
        } else if (name == "--connections") {
            if (!parse_int(value, 1, kMaxConnections, &options.connections))
                return fail("--connections must be a whole number from 1 to 16, not '" + value +
                            "'");
        } else if (name == "--lease") {
            if (!parse_duration(value, &options.lease) || options.lease < kMinLease)
                return bad_duration(name, "a duration of at least 100ms such as 30s or 500ms",
                                    value);
        } else if (name == "--metrics-addr") {
            std::string error;
            if (!parse_listen_address(value, &options.metrics_host, &options.metrics_port,
                                      &error))
                return fail("--metrics-addr '" + value + "': " + error);
            options.metrics = true;
        } else if (name == "--poll-interval") {
            if (!parse_duration(value, &options.poll_interval) ||
                options.poll_interval.count() < 1)
                return bad_duration(name, "a positive duration", value);
        } else if (name == "--http-timeout") {
            if (!parse_duration(value, &options.http_timeout) || options.http_timeout.count() < 1)
                return bad_duration(name, "a positive duration", value);
            explicit_http_timeout = true;
        } else if (name == "--connect-timeout") {
            if (!parse_duration(value, &options.connect_timeout) ||
                options.connect_timeout.count() < 1)
                return bad_duration(name, "a positive duration", value);
        } else if (name == "--progress-interval") {
            if (!parse_duration(value, &options.progress_interval))
                return bad_duration(name, "a duration, or 0 for none", value);
        } else if (name == "--maintenance-interval") {
            if (!parse_duration(value, &options.maintenance_interval) ||
                options.maintenance_interval.count() < 1)
                return bad_duration(name, "a positive duration such as 5s", value);
        } else if (name == "--ca-file" || name == "--client-cert" || name == "--client-key") {
            FILE* file = value.empty() ? nullptr : fopen(value.c_str(), "re");
            if (file == nullptr)
                return fail(name + ": cannot read '" + value + "'" +
                            (value.empty() ? "" : std::string(": ") + strerror(errno)));
            fclose(file);
            (name == "--ca-file" ? options.ca_file
             : name == "--client-cert" ? options.client_cert
                                       : options.client_key) = value;
        } else if (name == "--max-in-flight-bytes") {
            if (!parse_size(value, &options.max_in_flight_bytes) ||
                options.max_in_flight_bytes < 1024)
                return fail("--max-in-flight-bytes must be a size of at least 1kB (a number "
                            "with B, kB, MB or GB) such as 64MB, not '" + value + "'");
        }
    }

    // Secrets kept off the command line (where ps shows them): the
    // environment, as a service manager's EnvironmentFile= sets it.
    if (!has_sink) {
        const char* env = getenv("IDEM_RELAY_SINK");
        if (env != nullptr && *env != '\0') {
            if (!valid_sink(env))
                return fail("IDEM_RELAY_SINK must be 'stdout' or an http://, https://, nats:// or "
                            "amqp:// URL, not '" + redact_url(env) + "'");
            options.sink = env;
            has_sink = true;
        }
    }
    if (!has_dsn) {
        const char* env = getenv("IDEM_RELAY_DSN");
        if (env != nullptr) options.dsn = env;
    }

    if (!options.client_key.empty() && options.client_cert.empty())
        return fail("--client-key needs --client-cert");

    if (!has_relay) return fail("--relay is required");
    if (!has_sink) return fail("--sink is required (or --sink-file, or IDEM_RELAY_SINK)");
    if (has_topics == options.all_topics)
        return fail(has_topics ? "--topics and --all-topics exclude each other"
                               : "--topics or --all-topics is required: name the topics this "
                                 "sink takes, or say that it takes every topic");

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
  idem-relay [--dsn DSN] --relay NAME (--sink SINK | --sink-file FILE)
             (--topics a,b | --all-topics)
             [--batch N] [--run-length N] [--lease 30s] [--parallel N]
             [--connections N] [--once]
             [--metrics-addr HOST:PORT]

Required:
  --relay NAME         this relay's name, recorded on the events it claims
                       (1 to 255 bytes)
  --sink SINK          where events go:
                         stdout     one JSON object per line: {"id", "topic", "key",
                                    "headers", "payload", "attempt"}; acked once
                                    flushed, and in a pipe once the reader has
                                    read it; a closed pipe stops the relay
                         http://... or https://...
                                    POST of the payload (Content-Type:
                                    application/json unless the event's headers
                                    say otherwise) with the headers
                                    Idempotency-Key (the event's dedup_key, or
                                    outbox-<id>), X-Outbox-Id, X-Outbox-Topic,
                                    X-Outbox-Key (keyed events), X-Outbox-Attempt
                                    and the event's own headers (none that folds,
                                    '_' as '-', to a name the relay sets or HTTP
                                    framing owns; none with a control byte).
                                    Idempotency-Key, X-Outbox-Topic and
                                    X-Outbox-Key are percent-encoded: '%', space,
                                    control and non-ASCII bytes become %XX.
                         nats://[user:password@]host[:port][,host[:port]...][/prefix]
                                    NATS JetStream: published to the subject
                                    prefix.topic (the topic alone without a
                                    prefix), Nats-Msg-Id = the idempotency key so
                                    that the stream drops a repeat within its
                                    duplicate window, the X-Outbox-* headers and
                                    the event's own (none named Nats-*); acked
                                    once the stream's PubAck is in (one that says
                                    duplicate too). A stream must take the
                                    subjects.
                         amqp://[user:password@]host[:port][/vhost][?exchange=NAME]
                         amqps://...  the same over TLS
                                    RabbitMQ (AMQP 0-9-1, amqps:// over TLS on port
                                    5671 by default; guest:guest, port 5672
                                    and vhost / by default, percent-encoded as in
                                    a URI): persistent, mandatory messages to the
                                    exchange (the default exchange without one)
                                    with routing key = the topic, message_id = the
                                    idempotency key, the X-Outbox-* headers (id
                                    and attempt as numbers) and the event's own;
                                    acked once the broker confirmed it (publisher
                                    confirms). A message no queue takes comes
                                    back and is retried.
  --sink-file FILE     ... or the sink read from FILE (one line), so that a
                       secret in it (a password, a token as the user name or in
                       the query) stays off the command line, where ps shows it;
                       without either, the environment variable IDEM_RELAY_SINK
                       (as a service manager's EnvironmentFile= sets it) is read
  --topics a,b         the topics this sink takes (spaces around commas ignored)
  --all-topics         ... or every topic: one of the two is required

HTTP answers (the sink's first answer line and headers decide; a body is read
up to 1 MB and never changes the outcome):
  2xx                  delivered (acked)
  408, 409, 425, 429, 5xx, timeouts, connection errors
                       retried (nacked as retryable). 409 means a request with
                       this Idempotency-Key is still in progress. The wait is
                       the extension's backoff (idempotency.retry_base_delay
                       doubling per attempt, at most idempotency.retry_max_delay);
                       a longer Retry-After (seconds or HTTP date) is honoured
                       up to retry_max_delay. After idempotency.outbox_max_attempts
                       the event is dead.
  other 4xx            dead (nacked as final), except while the sink is checked:
                       when the first 10 distinct events delivered (or, with
                       --once, every event that could be tried) all get the same
                       such status, the sink is taken as misconfigured: the relay
                       stops (exit 1), the events stay pending, attempts not counted
  1xx, 3xx, others     retried (redirects are not followed)
  a TLS certificate not trusted (see --ca-file)
                       the sink is misconfigured: the relay stops (exit 1),
                       the events stay pending, attempts not counted

Broker answers (a claim's events are published together, their confirms
awaited at once, within --http-timeout):
  confirm: a JetStream PubAck, a RabbitMQ basic.ack
                       delivered (acked); a PubAck that says duplicate too
  nack: a RabbitMQ basic.nack, a JetStream error
                       retried, with the backoff above; dead after
                       idempotency.outbox_max_attempts
  return: a RabbitMQ message returned as unroutable (no queue takes it)
                       retried, as a nack
  blocked: RabbitMQ's connection.blocked (a memory or disk alarm)
                       nothing more published on the connection until it
                       unblocks: the events released within --http-timeout,
                       no attempt counted
  no PubAck or confirm in time, a publish the broker does not read
                       the publish is cut at --http-timeout, before the lease
                       ends; retried, as a nack
  connection lost      retried, as a nack, on a new connection
  larger than NATS's max_payload, or than the stream's max_msg_size
  (JetStream error 10054); headers over the stream's limit (10097)
                       dead
  larger than RabbitMQ's max_message_size
                       that message dead; the others of its group retried,
                       as a nack
  headers larger than an AMQP frame (the broker's frame_max)
                       dead, before it is published
  auth refused: NATS or RabbitMQ refused the user, password or token; a
  missing RabbitMQ vhost; a TLS certificate not trusted (see --ca-file)
  stream missing: JetStream's API says no stream takes the subject, or
  nothing serves it for the account (no JetStream); a missing RabbitMQ
  exchange
                       the sink is misconfigured: the relay stops (exit 1)
                       and says why, the events stay pending, attempts not
                       counted
  window short: a JetStream stream whose duplicate_window is shorter than
  --lease plus --http-timeout plus 10s (the first retries)
                       a warning, once per stream; delivered as usual (a
                       repeat after the window is stored twice)

Options (each at most once):
  --dsn DSN            libpq connection string or URI of the database that has the
                       extension, e.g. 'host=/run/postgresql dbname=app user=relay'
                       or postgresql://relay@db/app; without it (or for what it
                       leaves out) libpq's PGHOST, PGPORT, PGDATABASE, PGUSER,
                       PGSERVICE, ~/.pgpass and service files apply; without
                       --dsn the variable IDEM_RELAY_DSN is read first. The role
                       needs what idempotency.grant_relay gives (USAGE on schema
                       idempotency before 0.4.0).
  --batch N            events claimed per round trip, 1 to 10000 (default 100);
                       fewer when the deliveries so far show that not all of
                       them could start within the lease
  --run-length N       consecutive events of one (topic, key) a claim may hand
                       out together, 1 to 10000 (default 100): they are
                       delivered one after the other, and the first that is
                       not delivered stops the rest, which go back to wait
                       behind it. 1: one event of a key per claim
  --lease DURATION     how long a claimed event stays ours before another relay
                       may take it over (default 30s; at least 100ms, at most
                       the server's idempotency.max_lease). An event whose lease would run
                       out before its delivery could finish is not attempted: it
                       is released back to pending, no attempt counted
  --parallel N         deliveries in progress at once, on N threads (default 1,
                       at most 256). Events of different keys go out
                       concurrently; an event is never handed out while an
                       earlier event of its (topic, key) is in flight, waiting
                       to retry or dead, so per-key order holds with any N.
  --connections N      database connections, 1 to 16 (default 1): each claims,
                       delivers (with its own --parallel threads) and acks its
                       own batches, so that one connection's round trip runs
                       while another's batch is delivered; per-key order holds
                       across them as across relays. --max-in-flight-bytes is
                       shared out among them
  --once               deliver every event that is due now, then exit
  --max-in-flight-bytes SIZE  payload and headers held in memory at most
                       (default 64MB; kB, MB, GB); one event larger than that
                       still goes alone
  --metrics-addr ADDR  serve Prometheus text metrics on http://ADDR/metrics (and
                       a health check on /healthz: 503 while the database is
                       away or once the relay stops on a failure); ADDR is an
                       address or host name with a port: 127.0.0.1:9187 (this
                       machine only), 0.0.0.0:9187 or :9187 (every IPv4
                       address, for a scraper in a container network), [::]:9187;
                       port 0: any free port, logged at start. The metrics carry
                       no secrets, but expose them only to the scraper's network
  --poll-interval DUR  claim at least this often even without a notification
                       (default 1s); the relay wakes at once on LISTEN
                       idempotency_outbox (not through a pooler, where it
                       polls), polling picks up retries that came due,
                       delayed events and expired leases
  --http-timeout DUR   total time allowed for one delivery (default the smaller
                       of 10s and a third of --lease; must be shorter than
                       --lease); for stdout in a pipe, the time the reader may
                       take to read a line; for a broker, the time a claim's
                       publishes have to be confirmed
  --connect-timeout DUR  time allowed to connect to the HTTP sink or the broker
                       (default the smaller of 5s and --http-timeout)
  --progress-interval DUR  how often to print a progress line on stderr
                       (default 10s; 0 turns it off): delivered, retried and
                       dead counts, events in flight, the outbox lag (from
                       idempotency.outbox_lag, when the role may read it), the
                       longest enqueue-to-delivery delay of the interval, events
                       waiting for a retry, released and left to their lease, and
                       deliveries a broker already had (duplicates)
  --maintenance-interval DUR  call idempotency.idem_maintenance() at start and
                       then this long after the end of each call (default: never),
                       on a connection of its own: the sweeps of the SQL edition,
                       which has no background workers (lease expiry, settling,
                       purges). A failed call is logged as a warning and the
                       next one still made; deliveries never wait for it. The
                       role needs EXECUTE on the function (grant_admin, or a
                       GRANT of that function). With --once: one call
  --ca-file FILE       trust the CA certificates in FILE (PEM) instead of the
                       system's, for an https:// sink or a broker over TLS (a
                       receiver with a private CA); NATS then connects with
                       TLS. A certificate the relay does not trust is a
                       misconfigured sink: the relay stops (exit 1), the
                       events stay pending, attempts not counted
  --client-cert FILE   show this certificate (PEM) to an https:// sink or a
                       NATS server that asks for one (mutual TLS)
  --client-key FILE    its private key (PEM; default: in --client-cert's file)
  --help               show this help and exit
  --version            show the version and exit

Durations: a number with ms, s, m or h (a bare number is seconds): 500ms, 30s, 2m.

Behaviour:
  - Delivery is at least once: an event is acked only after the sink accepted
    it. A claim's transaction stays open while its events are delivered (at
    most 500ms, then it commits them as in flight) and commits with their
    acks. A relay killed mid-delivery leaves its events pending again at once
    (the open claim rolls back) or when their lease runs out; a duplicate
    carries the same idempotency key (Idempotency-Key, Nats-Msg-Id,
    message_id).
  - When the database goes away the relay reconnects with backoff (100ms
    doubling to 5s) and keeps the outcomes of deliveries made meanwhile, to
    ack or nack them once it is back. Only the first connection must succeed;
    with --once the relay gives up (exit 1) after 30s without a database.
  - An ack or nack the database refuses (a privilege revoked): /healthz says
    503, the relay stops and exits 1.
  - SIGTERM, SIGINT or SIGHUP: stop claiming, release the events not started, finish
    the deliveries in progress (at most --http-timeout), ack or nack them,
    exit 0; a stop takes at most --http-timeout plus 5s while the database
    answers. A second signal cuts the deliveries in progress short (they are
    retried). Give a service manager a stop timeout longer than that. SIGHUP
    reloads nothing (the settings are read once at start): it stops the
    relay as SIGTERM does, for its supervisor to start it with the new ones.
  - Log lines are one line each: CR, LF and other control bytes in topics, keys
    and errors are written as \n, \r, \xNN; every part of a sink URL's
    userinfo (user and password: a user name may be a token) and its query
    values are written as ***.

Exit status: 0 on success (including after SIGTERM/SIGINT/SIGHUP, and --once with
events waiting for a retry: its last line counts them); 1 on a runtime failure
(database unreachable at start, extension missing, permission denied, an ack
refused, a misconfigured sink or broker, stdout closed, metrics address in use, --once
with due events left undelivered); 2 on a bad command line; 3 when --once
finished but events went dead in the run.
)";
}

}  // namespace idem::relay
