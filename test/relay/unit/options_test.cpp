// idem-relay's command line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "relay/options.hpp"

using namespace idem::relay;

namespace {

ParseResult parse(std::vector<const char*> args) {
    args.insert(args.begin(), "idem-relay");
    return parse_options(static_cast<int>(args.size()), args.data());
}

std::vector<const char*> base(std::vector<const char*> more = {}) {
    std::vector<const char*> args = {"--dsn", "dbname=app", "--relay", "r1", "--sink", "stdout"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

// The required options, taking every topic.
std::vector<const char*> required(std::vector<const char*> more = {}) {
    more.insert(more.begin(), "--all-topics");
    return base(more);
}

}  // namespace

TEST(RelayOptions, RequiredOnlyGivesTheDefaults) {
    const ParseResult r = parse(required());
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.dsn, "dbname=app");
    EXPECT_EQ(r.options.relay, "r1");
    EXPECT_EQ(r.options.sink, "stdout");
    EXPECT_TRUE(r.options.topics.empty());
    EXPECT_TRUE(r.options.all_topics);
    EXPECT_EQ(r.options.max_in_flight_bytes, 64LL << 20);
    EXPECT_EQ(r.options.batch, 100);
    EXPECT_EQ(r.options.run_length, 100);
    EXPECT_EQ(r.options.lease, Millis(30000));
    EXPECT_EQ(r.options.parallel, 1);
    EXPECT_EQ(r.options.connections, 1);
    EXPECT_FALSE(r.options.once);
    EXPECT_FALSE(r.options.metrics);
    EXPECT_EQ(r.options.http_timeout, Millis(10000));
    EXPECT_EQ(r.options.connect_timeout, Millis(5000));
    EXPECT_EQ(r.options.poll_interval, Millis(1000));
    EXPECT_EQ(r.options.maintenance_interval, Millis(0));
}

TEST(RelayOptions, EveryOption) {
    const ParseResult r = parse(base({"--topics", "a,b", "--batch=500", "--run-length", "1",
                                      "--lease", "1m",
                                      "--parallel", "4", "--connections", "3", "--once",
                                      "--metrics-addr",
                                      "127.0.0.1:9187", "--poll-interval", "250ms",
                                      "--max-in-flight-bytes", "8MB",
                                      "--maintenance-interval", "2m"}));
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.topics, (std::vector<std::string>{"a", "b"}));
    EXPECT_FALSE(r.options.all_topics);
    EXPECT_EQ(r.options.max_in_flight_bytes, 8LL << 20);
    EXPECT_EQ(r.options.batch, 500);
    EXPECT_EQ(r.options.run_length, 1);
    EXPECT_EQ(r.options.lease, Millis(60000));
    EXPECT_EQ(r.options.parallel, 4);
    EXPECT_EQ(r.options.connections, 3);
    EXPECT_TRUE(r.options.once);
    EXPECT_TRUE(r.options.metrics);
    EXPECT_EQ(r.options.metrics_host, "127.0.0.1");
    EXPECT_EQ(r.options.metrics_port, 9187);
    EXPECT_EQ(r.options.poll_interval, Millis(250));
    EXPECT_EQ(r.options.maintenance_interval, Millis(120000));
}

TEST(RelayOptions, MaintenanceInterval) {
    const ParseResult r = parse(required({"--maintenance-interval=250ms"}));
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.maintenance_interval, Millis(250));
    const ParseResult bare = parse(required({"--maintenance-interval", "5"}));
    ASSERT_EQ(bare.status, ParseStatus::Run) << bare.error;
    EXPECT_EQ(bare.options.maintenance_interval, Millis(5000));
}

TEST(RelayOptions, HttpTimeoutFollowsAShortLease) {
    const ParseResult r = parse(required({"--lease", "3s"}));
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.http_timeout, Millis(1000));
    EXPECT_EQ(r.options.connect_timeout, Millis(1000));
}

TEST(RelayOptions, HelpAndVersion) {
    EXPECT_EQ(parse({"--help"}).status, ParseStatus::Help);
    EXPECT_EQ(parse({"-h"}).status, ParseStatus::Help);
    EXPECT_EQ(parse({"--version"}).status, ParseStatus::Version);
    const std::string text = usage();
    for (const char* option : {"--dsn", "--relay", "--sink", "--topics", "--all-topics", "--batch",
                               "--lease", "--parallel", "--connections", "--once", "--metrics-addr",
                               "--max-in-flight-bytes", "409", "Retry-After", "misconfigured",
                               "released", "Exit status", "nats://", "Nats-Msg-Id", "PubAck",
                               "amqp://", "message_id", "unroutable", "PGHOST", "0.0.0.0:9187",
                               "--maintenance-interval", "idem_maintenance"})
        EXPECT_NE(text.find(option), std::string::npos) << option;
}

TEST(RelayOptions, Errors) {
    struct Case {
        std::vector<const char*> args;
        const char* message;
    };
    const std::vector<Case> cases = {
        {{}, "--relay is required"},
        {{"--dsn", "x", "--sink", "stdout"}, "--relay is required"},
        {{"--dsn", "x", "--relay", "r"}, "--sink is required"},
        {required({"--bogus"}), "unknown option"},
        {required({"extra"}), "unexpected argument"},
        {required({"--batch"}), "needs a value"},
        {required({"--batch", "0"}), "--batch"},
        {required({"--batch", "10001"}), "--batch"},
        {required({"--batch", "12x"}), "--batch"},
        {required({"--run-length", "0"}), "--run-length"},
        {required({"--run-length", "10001"}), "--run-length"},
        {required({"--run-length", "many"}), "--run-length"},
        {required({"--parallel", "0"}), "--parallel"},
        {required({"--connections", "0"}), "--connections"},
        {required({"--connections", "17"}), "--connections"},
        {required({"--connections", "-1"}), "--connections"},
        {required({"--connections", "two"}), "--connections"},
        {required({"--connections", ""}), "--connections"},
        {required({"--connections"}), "needs a value"},
        {required({"--lease", "0s"}), "--lease"},
        {required({"--lease", "-1s"}), "--lease"},
        {required({"--lease", "10 s"}), "--lease"},
        {required({"--lease", "99ms"}), "--lease must be a duration of at least 100ms"},
        {required({"--lease", "1ms"}), "--lease must be a duration of at least 100ms"},
        {required({"--lease", "99999999999h"}), "at most 100 years"},
        {required({"--poll-interval", "999999999h"}), "at most 100 years"},
        {required({"--max-in-flight-bytes", "1TB"}), "B, kB, MB or GB"},
        {required({"--topics", "a,,b"}), "empty topic"},
        {required({"--metrics-addr", "no-such-host.invalid:80"}), "cannot resolve"},
        {required({"--metrics-addr", "127.0.0.1"}), "HOST:PORT"},
        {required({"--metrics-addr", "127.0.0.1:70000"}), "port"},
        {required({"--lease", "5s", "--http-timeout", "5s"}), "shorter than --lease"},
        {required({"--once=yes"}), "takes no value"},
        {{"--dsn", "x", "--relay", "r", "--sink", "ftp://host/"}, "--sink must be"},
        {{"--relay", "r", "--sink", "nats:/host"}, "--sink must be"},
        {base(), "--topics or --all-topics is required"},
        {base({"--topics", "a", "--all-topics"}), "exclude each other"},
        {base({"--topics", "a, ,b"}), "empty topic"},
        {base({"--all-topics=yes"}), "takes no value"},
        {required({"--max-in-flight-bytes", "100"}), "--max-in-flight-bytes"},
        {required({"--max-in-flight-bytes", "5TB"}), "--max-in-flight-bytes"},
        {required({"--maintenance-interval", "0"}), "--maintenance-interval must be a positive"},
        {required({"--maintenance-interval", "0.1ms"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", "-5s"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", ""}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", "5 s"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", "5d"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", "1e300s"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval", "soon"}), "--maintenance-interval must be"},
        {required({"--maintenance-interval"}), "needs a value"},
        {base({"--topics", "a", "--topics", "b"}), "--topics is given twice: name every topic"},
        {required({"--relay", "r2"}), "--relay is given twice: give it once"},
        {required({"--relay=r1"}), "--relay is given twice"},
        {required({"--dsn", "dbname=other"}), "--dsn is given twice"},
        {required({"--batch", "10", "--batch=20"}), "--batch is given twice"},
        {required({"--lease", "30s", "--lease", "30s"}), "--lease is given twice"},
        {required({"--sink", "stdout"}), "the sink is given already"},
    };
    for (const Case& c : cases) {
        const ParseResult r = parse(c.args);
        EXPECT_EQ(r.status, ParseStatus::Error) << c.message;
        EXPECT_NE(r.error.find(c.message), std::string::npos) << r.error << " / " << c.message;
    }
}

TEST(RelayOptions, TopicsAreTrimmed) {
    const ParseResult r = parse(base({"--topics", " a, b ,c\t"}));
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.topics, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(RelayOptions, ASinkPasswordIsNotEchoed) {
    const ParseResult r = parse({"--dsn", "x", "--relay", "r", "--all-topics", "--sink",
                                 "ftp://u:secret@host/?token=t0k"});
    ASSERT_EQ(r.status, ParseStatus::Error);
    EXPECT_EQ(r.error.find("secret"), std::string::npos) << r.error;
    EXPECT_EQ(r.error.find("t0k"), std::string::npos) << r.error;
}

TEST(RelayOptions, Sizes) {
    std::int64_t n = 0;
    ASSERT_TRUE(parse_size("64MB", &n));
    EXPECT_EQ(n, 64LL << 20);
    ASSERT_TRUE(parse_size("512kB", &n));
    EXPECT_EQ(n, 512LL << 10);
    ASSERT_TRUE(parse_size("1g", &n));
    EXPECT_EQ(n, 1LL << 30);
    ASSERT_TRUE(parse_size("4096", &n));
    EXPECT_EQ(n, 4096);
    EXPECT_FALSE(parse_size("", &n));
    EXPECT_FALSE(parse_size("MB", &n));
    EXPECT_FALSE(parse_size("-1MB", &n));
    EXPECT_FALSE(parse_size("1.5MB", &n));
    EXPECT_FALSE(parse_size("99999999999999GB", &n));
}

TEST(RelayOptions, Durations) {
    Millis d;
    ASSERT_TRUE(parse_duration("30s", &d));
    EXPECT_EQ(d, Millis(30000));
    ASSERT_TRUE(parse_duration("30", &d));
    EXPECT_EQ(d, Millis(30000));
    ASSERT_TRUE(parse_duration("1.5s", &d));
    EXPECT_EQ(d, Millis(1500));
    ASSERT_TRUE(parse_duration("250ms", &d));
    EXPECT_EQ(d, Millis(250));
    ASSERT_TRUE(parse_duration("2m", &d));
    EXPECT_EQ(d, Millis(120000));
    ASSERT_TRUE(parse_duration("1h", &d));
    EXPECT_EQ(d, Millis(3600000));
    EXPECT_FALSE(parse_duration("", &d));
    EXPECT_FALSE(parse_duration("s", &d));
    EXPECT_FALSE(parse_duration("5 s", &d));
    EXPECT_FALSE(parse_duration("5d", &d));
    EXPECT_FALSE(parse_duration("-5s", &d));
    EXPECT_FALSE(parse_duration("nan", &d));
}

TEST(RelayOptions, ListenAddresses) {
    std::string host, error;
    int port = -1;
    ASSERT_TRUE(parse_listen_address("localhost:0", &host, &port, &error)) << error;
    EXPECT_TRUE(host == "127.0.0.1" || host == "::1") << host;
    EXPECT_EQ(port, 0);
    ASSERT_TRUE(parse_listen_address("127.0.0.2:9187", &host, &port, &error)) << error;
    ASSERT_TRUE(parse_listen_address("[::1]:9187", &host, &port, &error)) << error;
    EXPECT_EQ(host, "::1");
    EXPECT_EQ(port, 9187);
    // Any address, so that a scraper elsewhere (another container) reaches it.
    ASSERT_TRUE(parse_listen_address("0.0.0.0:9187", &host, &port, &error)) << error;
    EXPECT_EQ(host, "0.0.0.0");
    ASSERT_TRUE(parse_listen_address("[::]:9187", &host, &port, &error)) << error;
    EXPECT_EQ(host, "::");
    ASSERT_TRUE(parse_listen_address("10.1.2.3:9187", &host, &port, &error)) << error;
    EXPECT_EQ(host, "10.1.2.3");
    ASSERT_TRUE(parse_listen_address(":9187", &host, &port, &error)) << error;
    EXPECT_EQ(host, "0.0.0.0");
    EXPECT_FALSE(parse_listen_address("no-such-host.invalid:9187", &host, &port, &error));
    EXPECT_FALSE(parse_listen_address("0.0.0.0", &host, &port, &error));
}

TEST(RelayOptions, DsnIsOptional) {
    const ParseResult r = parse({"--relay", "r1", "--sink", "stdout", "--all-topics"});
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.dsn, "");
}

TEST(RelayOptions, BrokerSinks) {
    for (const char* sink : {"nats://127.0.0.1:4222", "amqp://guest:guest@127.0.0.1/%2F"}) {
        const ParseResult r = parse({"--relay", "r1", "--sink", sink, "--all-topics"});
        ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
        EXPECT_EQ(r.options.sink, sink);
    }
}

// Secrets off the command line: --sink-file and IDEM_RELAY_SINK, and the
// DSN from IDEM_RELAY_DSN.
TEST(RelayOptions, SinkFromFileOrEnvironment) {
    std::string templ = testing::TempDir() + "idem-relay-sink-XXXXXX";
    std::vector<char> buffer(templ.begin(), templ.end());
    buffer.push_back('\0');
    char* path = buffer.data();
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    const std::string url = "https://TOKEN@hooks.example/in?token=s3cret";
    ASSERT_EQ(write(fd, (url + "\n").data(), url.size() + 1), static_cast<ssize_t>(url.size() + 1));
    close(fd);
    ParseResult r = parse({"--relay", "r", "--sink-file", path, "--all-topics"});
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.sink, url);
    r = parse({"--relay", "r", "--sink-file", path, "--sink", "stdout", "--all-topics"});
    EXPECT_EQ(r.status, ParseStatus::Error);
    EXPECT_NE(r.error.find("given already"), std::string::npos) << r.error;
    r = parse({"--relay", "r", "--sink-file", "/nonexistent/sink", "--all-topics"});
    EXPECT_EQ(r.status, ParseStatus::Error);
    EXPECT_NE(r.error.find("cannot read"), std::string::npos) << r.error;
    unlink(path);

    setenv("IDEM_RELAY_SINK", url.c_str(), 1);
    setenv("IDEM_RELAY_DSN", "dbname=fromenv", 1);
    r = parse({"--relay", "r", "--all-topics"});
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.sink, url);
    EXPECT_EQ(r.options.dsn, "dbname=fromenv");
    // The command line wins.
    r = parse({"--relay", "r", "--all-topics", "--sink", "stdout", "--dsn", "dbname=x"});
    EXPECT_EQ(r.options.sink, "stdout");
    EXPECT_EQ(r.options.dsn, "dbname=x");
    setenv("IDEM_RELAY_SINK", "ftp://u:pw@h/", 1);
    r = parse({"--relay", "r", "--all-topics"});
    EXPECT_EQ(r.status, ParseStatus::Error);
    EXPECT_EQ(r.error.find("pw"), std::string::npos) << r.error;
    unsetenv("IDEM_RELAY_SINK");
    unsetenv("IDEM_RELAY_DSN");
}

// --ca-file, --client-cert and --client-key name files that must be readable.
TEST(RelayOptions, TlsFiles) {
    ParseResult r = parse(required({"--ca-file", "/nonexistent/ca.pem"}));
    EXPECT_EQ(r.status, ParseStatus::Error);
    EXPECT_NE(r.error.find("--ca-file: cannot read"), std::string::npos) << r.error;
    r = parse(required({"--ca-file", "/dev/null", "--client-cert", "/dev/null"}));
    ASSERT_EQ(r.status, ParseStatus::Run) << r.error;
    EXPECT_EQ(r.options.ca_file, "/dev/null");
    EXPECT_EQ(r.options.client_cert, "/dev/null");
    EXPECT_TRUE(r.options.client_key.empty());
    r = parse(required({"--client-key", "/dev/null"}));
    EXPECT_EQ(r.status, ParseStatus::Error);
    EXPECT_NE(r.error.find("needs --client-cert"), std::string::npos) << r.error;
    EXPECT_EQ(parse({"--relay", "r", "--sink", "amqps://mq/", "--all-topics"}).status, ParseStatus::Run);
}
