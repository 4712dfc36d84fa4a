#include "relay/metrics_server.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay/log.hpp"

namespace idem::relay {

namespace {

constexpr std::size_t kMaxRequestBytes = 8192;
constexpr int kClientTimeoutMs = 2000;

void write_all(int fd, const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
        const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        sent += static_cast<std::size_t>(n);
    }
}

std::string response(int status, const char* reason, const char* type, const std::string& body,
                     bool head) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
    out += std::string("Content-Type: ") + type + "\r\n";
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    out += "Connection: close\r\n\r\n";
    if (!head) out += body;
    return out;
}

}  // namespace

MetricsServer::MetricsServer(const Stats& stats, std::string relay)
    : stats_(stats), relay_(std::move(relay)) {}

MetricsServer::~MetricsServer() { stop(); }

bool MetricsServer::start(const std::string& host, int port, std::string* error) {
    sockaddr_storage address{};
    socklen_t length;
    int family;
    if (host.find(':') != std::string::npos) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(static_cast<uint16_t>(port));
        inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr);
        length = sizeof *in6;
        family = AF_INET6;
    } else {
        auto* in4 = reinterpret_cast<sockaddr_in*>(&address);
        in4->sin_family = AF_INET;
        in4->sin_port = htons(static_cast<uint16_t>(port));
        inet_pton(AF_INET, host.c_str(), &in4->sin_addr);
        length = sizeof *in4;
        family = AF_INET;
    }
    const std::string shown = (family == AF_INET6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
    listen_fd_ = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) {
        *error = "cannot create the metrics socket: " + std::string(strerror(errno));
        return false;
    }
    const int yes = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listen_fd_, 16) != 0) {
        *error = "cannot listen on " + shown + " for metrics: " + strerror(errno);
        close(listen_fd_);
        listen_fd_ = -1;
        return false;
    }
    sockaddr_storage bound{};
    socklen_t bound_length = sizeof bound;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
    port_ = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    thread_ = std::thread([this] { serve(); });
    return true;
}

void MetricsServer::stop() {
    if (thread_.joinable()) {
        stop_pipe_.notify();
        thread_.join();
    }
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
}

void MetricsServer::serve() {
    for (;;) {
        pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_.fd(), POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            log_warning("metrics endpoint: poll failed: %s", strerror(errno));
            return;
        }
        if (fds[1].revents != 0) return;
        if ((fds[0].revents & POLLIN) == 0) continue;
        const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client < 0) continue;
        answer(client);
        close(client);
    }
}

void MetricsServer::answer(int client) {
    // One request per connection, read until the end of its headers.
    std::string request;
    char buffer[1024];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
        pollfd fd = {client, POLLIN, 0};
        if (poll(&fd, 1, kClientTimeoutMs) <= 0) return;
        const ssize_t n = recv(client, buffer, sizeof buffer, 0);
        if (n <= 0) return;
        request.append(buffer, static_cast<std::size_t>(n));
    }
    const std::size_t line_end = request.find("\r\n");
    const std::string line = request.substr(0, line_end);
    const std::size_t space1 = line.find(' ');
    const std::size_t space2 = line.find(' ', space1 + 1);
    if (space1 == std::string::npos || space2 == std::string::npos) {
        write_all(client, response(400, "Bad Request", "text/plain", "bad request\n", false));
        return;
    }
    const std::string method = line.substr(0, space1);
    std::string path = line.substr(space1 + 1, space2 - space1 - 1);
    path = path.substr(0, path.find('?'));
    const bool head = method == "HEAD";
    if (method != "GET" && !head) {
        write_all(client, response(405, "Method Not Allowed", "text/plain", "GET only\n", false));
    } else if (path == "/metrics" || path == "/") {
        write_all(client, response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                                   stats_.prometheus(relay_), head));
    } else if (path == "/healthz") {
        const bool healthy = stats_.healthy.load();
        const bool up = stats_.connected();
        const char* body = !healthy ? "stopping on a failure (see the relay's log)\n"
                           : !up    ? "database connection down\n"
                                    : "ok\n";
        write_all(client, response(healthy && up ? 200 : 503,
                                   healthy && up ? "OK" : "Service Unavailable", "text/plain",
                                   body, head));
    } else {
        write_all(client, response(404, "Not Found", "text/plain", "not found\n", head));
    }
}

}  // namespace idem::relay
