// --metrics-addr: a tiny HTTP server that answers GET /metrics (Prometheus
// text) and GET /healthz to many clients at once, each within a deadline of
// its own (2 s for the whole exchange), on one thread of its own: a slow or
// stalled client never delays another (a liveness probe keeps its answer).
#pragma once

#include <string>
#include <thread>

#include "relay/observe/stats.hpp"
#include "relay/wake.hpp"

namespace idem::relay {

class MetricsServer {
public:
    MetricsServer(const Stats& stats, std::string relay);
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

    // Binds and starts serving; false with *error when the address is unusable.
    bool start(const std::string& host, int port, std::string* error);
    int port() const { return port_; }
    void stop();

private:
    void serve();
    // The response to one request (its bytes up to the end of the headers).
    std::string answer(const std::string& request) const;

    const Stats& stats_;
    std::string relay_;
    int listen_fd_ = -1;
    int port_ = 0;
    WakePipe stop_pipe_;
    std::thread thread_;
};

}  // namespace idem::relay
