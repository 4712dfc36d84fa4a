#include "relay/observe/metrics_server.hpp"

#include <arpa/inet.h>
#include <chrono>
#include <vector>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay/observe/log.hpp"

namespace idem::relay {

namespace {

constexpr std::size_t kMaxRequestBytes = 8192;
// The whole exchange (request in, response out) of one connection.
constexpr std::chrono::milliseconds kRequestDeadline{2000};
constexpr std::size_t kMaxClients = 64;

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
    listen_fd_ = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd_ < 0) {
        *error = "cannot create the metrics socket: " + std::string(strerror(errno));
        return false;
    }
    const int yes = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listen_fd_, 128) != 0) {
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

// One thread serves every connection at once: each reads its request and
// writes its answer as its socket allows (non-blocking, one poll over all),
// and is closed at its deadline, so a slow or silent client holds one slot
// for at most kRequestDeadline and never delays another. When every slot is
// taken, the oldest connection gives way to the new one.
void MetricsServer::serve() {
    struct Client {
        int fd;
        std::chrono::steady_clock::time_point deadline;
        std::string in;
        std::string out;
        std::size_t sent = 0;
        bool answered = false;
    };
    std::vector<Client> clients;
    std::vector<pollfd> fds;
    const auto drop = [&clients](std::size_t i) {
        close(clients[i].fd);
        clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
    };
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        for (std::size_t i = clients.size(); i-- > 0;)
            if (clients[i].deadline <= now) drop(i);
        int timeout = -1;
        for (const Client& client : clients) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  client.deadline - now).count() + 1;
            if (timeout < 0 || left < timeout) timeout = static_cast<int>(left);
        }
        fds.assign({{listen_fd_, POLLIN, 0}, {stop_pipe_.fd(), POLLIN, 0}});
        for (const Client& client : clients)
            fds.push_back({client.fd, static_cast<short>(client.answered ? POLLOUT : POLLIN), 0});
        if (poll(fds.data(), fds.size(), timeout) < 0) {
            if (errno == EINTR) continue;
            log_warning("metrics endpoint: poll failed: %s", strerror(errno));
            break;
        }
        if (fds[1].revents != 0) break;
        // The clients first (their indexes match fds), then the new ones.
        for (std::size_t i = clients.size(); i-- > 0;) {
            const short revents = fds[i + 2].revents;
            if (revents == 0) continue;
            Client& client = clients[i];
            if (!client.answered) {
                char buffer[1024];
                const ssize_t n = recv(client.fd, buffer, sizeof buffer, 0);
                if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
                if (n <= 0) {
                    drop(i);
                    continue;
                }
                client.in.append(buffer, static_cast<std::size_t>(n));
                if (client.in.find("\r\n\r\n") == std::string::npos &&
                    client.in.size() < kMaxRequestBytes)
                    continue;
                client.out = answer(client.in);
                client.answered = true;
            }
            const ssize_t n = send(client.fd, client.out.data() + client.sent,
                                   client.out.size() - client.sent, MSG_NOSIGNAL);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n <= 0) {
                drop(i);
                continue;
            }
            client.sent += static_cast<std::size_t>(n);
            if (client.sent == client.out.size()) drop(i);
        }
        if ((fds[0].revents & POLLIN) == 0) continue;
        for (;;) {
            const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) break;
            if (clients.size() >= kMaxClients) drop(0);
            clients.push_back(Client{fd, std::chrono::steady_clock::now() + kRequestDeadline,
                                     {}, {}, 0, false});
        }
    }
    for (std::size_t i = clients.size(); i-- > 0;) drop(i);
}

std::string MetricsServer::answer(const std::string& request) const {
    const std::size_t line_end = request.find("\r\n");
    const std::string line = request.substr(0, line_end);
    const std::size_t space1 = line.find(' ');
    const std::size_t space2 = line.find(' ', space1 + 1);
    if (space1 == std::string::npos || space2 == std::string::npos) {
        return response(400, "Bad Request", "text/plain", "bad request\n", false);
    }
    const std::string method = line.substr(0, space1);
    std::string path = line.substr(space1 + 1, space2 - space1 - 1);
    path = path.substr(0, path.find('?'));
    const bool head = method == "HEAD";
    if (method != "GET" && !head) {
        return response(405, "Method Not Allowed", "text/plain", "GET only\n", false);
    } else if (path == "/metrics" || path == "/") {
        return response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                        stats_.prometheus(relay_), head);
    } else if (path == "/healthz") {
        const bool healthy = stats_.healthy.load();
        const bool up = stats_.connected();
        const char* body = !healthy ? "stopping on a failure (see the relay's log)\n"
                           : !up    ? "database connection down\n"
                                    : "ok\n";
        return response(healthy && up ? 200 : 503, healthy && up ? "OK" : "Service Unavailable",
                        "text/plain", body, head);
    }
    return response(404, "Not Found", "text/plain", "not found\n", head);
}

}  // namespace idem::relay
