// The command line of idem-relay: parsing, validation and --help.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace idem::relay {

using Millis = std::chrono::milliseconds;

struct Options {
    std::string dsn;                  // --dsn or IDEM_RELAY_DSN: libpq string or URI ("": PG* variables)
    std::string relay;                // --relay: this relay's name (outbox_claim's relay)
    std::string sink;                 // --sink, --sink-file or IDEM_RELAY_SINK: "stdout" or a URL
    std::vector<std::string> topics;  // --topics a,b: empty with --all-topics
    bool all_topics = false;          // --all-topics: every topic (an explicit choice)
    int batch = 100;                  // --batch: events per claim (1..10000)
    int run_length = 100;             // --run-length: events of one key per claim (1..10000)
    Millis lease{30000};              // --lease: how long a claimed event is ours
    int parallel = 1;                 // --parallel: concurrent deliveries (per connection)
    int connections = 1;              // --connections: database connections, each claiming on its own
    bool once = false;                // --once: deliver what is due, then exit
    bool metrics = false;             // --metrics-addr given
    std::string metrics_host;         // numeric address to listen on
    int metrics_port = 0;             // 0: any free port
    Millis poll_interval{1000};       // --poll-interval: claim at least this often
    Millis http_timeout{0};           // --http-timeout: 0 = min(10s, lease/3)
    Millis connect_timeout{0};        // --connect-timeout: 0 = min(5s, http timeout)
    Millis progress_interval{10000};  // --progress-interval: 0 = no progress lines
    Millis maintenance_interval{0};   // --maintenance-interval: 0 = idem_maintenance() is not called
    std::int64_t max_in_flight_bytes = 64LL << 20;  // --max-in-flight-bytes
    std::string ca_file;              // --ca-file: PEM CA certificates to trust ("": the system's)
    std::string client_cert;          // --client-cert: PEM certificate shown to the sink
    std::string client_key;           // --client-key: its key ("": in --client-cert's file)
};

enum class ParseStatus { Run, Help, Version, Error };

struct ParseResult {
    ParseStatus status = ParseStatus::Error;
    Options options;
    std::string error;  // for ParseStatus::Error
};

ParseResult parse_options(int argc, const char* const* argv);

// The --help text.
std::string usage();

// "250ms", "30s", "1.5s", "2m", "1h"; a bare number is seconds. False when
// the text is not a duration or is negative.
bool parse_duration(const std::string& text, Millis* out);

// "64MB", "512kB", "1GB", a bare number of bytes (units of 1024). False when
// the text is not a size.
bool parse_size(const std::string& text, std::int64_t* out);

// "127.0.0.1:9187", "[::1]:9187", "0.0.0.0:9187", ":9187" (every IPv4
// address), "relay-1:9187" (a host name, resolved now). The host comes back
// numeric.
bool parse_listen_address(const std::string& text, std::string* host, int* port,
                          std::string* error);

}  // namespace idem::relay
