// idem-relay: delivers the idempotency extension's outbox events to a sink.
// Wiring only: options, sink, database, delivery threads, metrics, the loop.
#include <cstdio>
#include <memory>
#include <string>

#include <curl/curl.h>

#include "relay/database.hpp"
#include "relay/exit_status.hpp"
#include "relay/log.hpp"
#include "relay/metrics_server.hpp"
#include "relay/options.hpp"
#include "relay/relay.hpp"
#include "relay/signals.hpp"
#include "relay/sink.hpp"
#include "relay/stats.hpp"
#include "relay/wake.hpp"
#include "relay/worker_pool.hpp"

namespace {

// The project's version (idempotency.control), given by the build.
#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined by the build"
#endif
constexpr const char* kVersion = IDEM_VERSION;
using idem::relay::kExitFailure;
using idem::relay::kExitUsage;

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
    return out.empty() ? "every topic" : out;
}

int run(const idem::relay::Options& options) {
    using namespace idem::relay;
    set_log_name(options.relay);

    std::string error;
    std::unique_ptr<SinkTarget> target = make_sink_target(options, &error);
    if (!target) {
        fprintf(stderr, "idem-relay: %s\n", error.c_str());
        return kExitUsage;
    }

    WakePipe wake;
    if (!wake.ok()) {
        log_error("cannot create a pipe");
        return kExitFailure;
    }
    install_signal_handlers(wake);

    Database db(options);
    const DbStatus status = db.connect(&error);
    if (status != DbStatus::Ok) {
        log_error("cannot connect to the database: %s", error.c_str());
        return kExitFailure;
    }

    Stats stats;
    stats.connected = true;
    // Helper threads never take SIGTERM/SIGINT: the loop's poll() does.
    block_stop_signals(true);
    MetricsServer metrics(stats, options.relay);
    if (options.metrics && !metrics.start(options.metrics_host, options.metrics_port, &error)) {
        block_stop_signals(false);
        log_error("%s", error.c_str());
        return kExitFailure;
    }
    WorkerPool pool(*target, options.parallel, wake, stats);
    block_stop_signals(false);

    log_info("delivering %s to %s (batch %d, lease %lld ms, parallel %d%s)%s",
             joined(options.topics).c_str(), target->describe().c_str(), options.batch,
             static_cast<long long>(options.lease.count()), options.parallel,
             options.once ? ", once" : "",
             options.metrics
                 ? (", metrics on http://" +
                    (options.metrics_host.find(':') != std::string::npos
                         ? "[" + options.metrics_host + "]"
                         : options.metrics_host) +
                    ":" + std::to_string(metrics.port()) + "/metrics")
                       .c_str()
                 : "");

    Relay relay(options, db, pool, *target, stats, wake);
    const int code = relay.run();
    metrics.stop();
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace idem::relay;
    const ParseResult parsed = parse_options(argc, argv);
    switch (parsed.status) {
        case ParseStatus::Help:
            fputs(usage().c_str(), stdout);
            return 0;
        case ParseStatus::Version:
            printf("idem-relay %s\n", kVersion);
            return 0;
        case ParseStatus::Error:
            fprintf(stderr, "idem-relay: %s\nTry 'idem-relay --help' for more information.\n",
                    parsed.error.c_str());
            return kExitUsage;
        case ParseStatus::Run: break;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "idem-relay: libcurl could not be initialised\n");
        return kExitFailure;
    }
    const int code = run(parsed.options);
    curl_global_cleanup();
    return code;
}
