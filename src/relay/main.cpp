// idem-relay: delivers the idempotency extension's outbox events to a sink.
// Wiring only: options, sink, the lanes (a connection, delivery threads and
// a loop each), metrics, the maintenance calls.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <curl/curl.h>

#include "relay/db/database.hpp"
#include "relay/db/maintenance_caller.hpp"
#include "relay/loop/exit_status.hpp"
#include "relay/loop/final_status.hpp"
#include "relay/loop/lanes.hpp"
#include "relay/loop/relay.hpp"
#include "relay/loop/signals.hpp"
#include "relay/loop/worker_pool.hpp"
#include "relay/observe/log.hpp"
#include "relay/observe/metrics_server.hpp"
#include "relay/observe/progress.hpp"
#include "relay/observe/stats.hpp"
#include "relay/options.hpp"
#include "relay/sinks/factory.hpp"
#include "relay/wake.hpp"

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

// One lane (loop/lanes.hpp): its options (a share of --max-in-flight-bytes), wake
// pipe, connection, delivery threads and loop.
struct Lane {
    explicit Lane(const idem::relay::Options& whole) : options(whole), db(options) {
        options.max_in_flight_bytes =
            std::max<std::int64_t>(1024, whole.max_in_flight_bytes / whole.connections);
    }
    idem::relay::Options options;
    idem::relay::WakePipe wake;
    idem::relay::Database db;
    std::unique_ptr<idem::relay::WorkerPool> pool;
    std::unique_ptr<idem::relay::Relay> relay;
    int code = 0;
};

int run(const idem::relay::Options& options) {
    using namespace idem::relay;
    set_log_name(options.relay);

    std::string error;
    std::unique_ptr<SinkTarget> target = make_sink_target(options, &error);
    if (!target) {
        fprintf(stderr, "idem-relay: %s\n", error.c_str());
        return kExitUsage;
    }

    std::vector<std::unique_ptr<Lane>> lanes;
    std::vector<const WakePipe*> wakes;
    // Destroyed before the lanes: the signal handler lets go of their pipes.
    struct ForgetPipes {
        ~ForgetPipes() { forget_wake_pipes(); }
    } forget_pipes;
    for (int i = 0; i < options.connections; ++i) {
        lanes.push_back(std::make_unique<Lane>(options));
        if (!lanes.back()->wake.ok()) {
            log_error("cannot create a pipe");
            return kExitFailure;
        }
        wakes.push_back(&lanes.back()->wake);
    }
    install_signal_handlers(wakes);

    for (std::size_t i = 0; i < lanes.size(); ++i) {
        const DbStatus status = lanes[i]->db.connect(&error);
        if (status != DbStatus::Ok) {
            if (lanes.size() == 1)
                log_error("cannot connect to the database: %s", error.c_str());
            else
                log_error("cannot connect to the database (connection %zu of %zu): %s", i + 1,
                          lanes.size(), error.c_str());
            return kExitFailure;
        }
    }

    Stats stats;
    // Helper threads never take SIGTERM/SIGINT: the main thread's does.
    block_stop_signals(true);
    MetricsServer metrics(stats, options.relay);
    MaintenanceCaller maintenance(options);
    LaneGroup group(wakes, stats);
    ProgressLine progress(Clock::now());
    std::vector<std::thread> threads;  // lanes 1 and on
    try {
        if (options.metrics && !metrics.start(options.metrics_host, options.metrics_port, &error)) {
            block_stop_signals(false);
            log_error("%s", error.c_str());
            return kExitFailure;
        }
        for (std::size_t i = 0; i < lanes.size(); ++i) {
            Lane& lane = *lanes[i];
            lane.pool = std::make_unique<WorkerPool>(*target, options.parallel, lane.wake, stats);
            lane.relay = std::make_unique<Relay>(lane.options, lane.db, *lane.pool, *target,
                                                 stats, lane.wake, group,
                                                 i == 0 ? &progress : nullptr);
        }
        log_info("delivering %s to %s (batch %d, lease %lld ms, parallel %d%s%s%s)%s",
                 joined(options.topics).c_str(), target->describe().c_str(), options.batch,
                 static_cast<long long>(options.lease.count()), options.parallel,
                 options.connections > 1
                     ? (", connections " + std::to_string(options.connections)).c_str()
                     : "",
                 options.once ? ", once" : "",
                 options.maintenance_interval.count() > 0
                     ? (", idem_maintenance every " +
                        std::to_string(options.maintenance_interval.count()) + " ms")
                           .c_str()
                     : "",
                 options.metrics
                     ? (", metrics on http://" +
                        (options.metrics_host.find(':') != std::string::npos
                             ? "[" + options.metrics_host + "]"
                             : options.metrics_host) +
                        ":" + std::to_string(metrics.port()) + "/metrics")
                           .c_str()
                     : "");
        // Started while the stop signals are blocked, as the other helpers.
        maintenance.start();
        // Lane 0 runs here, where the stop signals arrive; the others on threads.
        for (std::size_t i = 1; i < lanes.size(); ++i)
            threads.emplace_back([&lane = *lanes[i]] { lane.code = lane.relay->run(); });
    } catch (const std::system_error& e) {
        // Past a limit on threads (ulimit -u, a cgroup's or systemd's
        // TasksMax): say so instead of aborting. The lanes started stop.
        group.fail();
        for (std::thread& thread : threads) thread.join();
        for (const auto& lane : lanes)
            if (lane->pool) lane->pool->stop();
        log_error("cannot start its threads (--parallel %d on each of %d connection(s): %d "
                  "delivery threads): %s; a limit on threads applies (ulimit -u, systemd's "
                  "TasksMax): lower --parallel or --connections",
                  options.parallel, options.connections, options.parallel * options.connections,
                  e.what());
        return kExitFailure;
    }

    block_stop_signals(false);
    lanes[0]->code = lanes[0]->relay->run();
    for (std::thread& thread : threads) thread.join();
    maintenance.stop();

    int code = kExitOk;
    for (const auto& lane : lanes)
        if (code == kExitOk) code = lane->code;
    const bool stopped = stop_requests() > 0 || group.failed();
    const int status = final_status(options, stats, code, stopped);
    if (options.progress_interval.count() > 0 || stopped || options.once)
        progress.print(stats, Clock::now(), true);
    metrics.stop();
    return status;
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
