// Non-blocking HTTP server for GET /metrics (see metrics/http_server.hpp).
#include "metrics/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iterator>

#include "core/error.hpp"

namespace eventbox::metrics {

namespace {

// Room for a burst of connections between two steps of a busy owner; beyond it the kernel
// drops SYNs and the client retries only after a second.
constexpr int kListenBacklog = 128;
// The epoll set's tag for the listening socket (connections are tagged with their id).
constexpr uint64_t kListenId = UINT64_MAX;
// After accept() ran out of descriptors with nothing to close, how long to stop listening.
constexpr int64_t kAcceptPauseMs = 1000;
constexpr int kEventsPerStep = 64;

[[noreturn]] void bad_address(std::string_view address, const std::string& why) {
    throw Error(sqlstate::kInvalidParameterValue,
                "invalid eventbox.metrics_address \"" + std::string(address) + "\": " + why, {},
                "Write host:port, e.g. 127.0.0.1:9187.");
}

bool set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL, 0);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 &&
           fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
}

}  // namespace

void parse_address(std::string_view address, std::string* host, int* port) {
    std::size_t colon = address.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size())
        bad_address(address, "expected host:port");
    std::string_view h = address.substr(0, colon);
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    long p = 0;
    for (char c : address.substr(colon + 1)) {
        if (c < '0' || c > '9') bad_address(address, "the port is not a number");
        p = p * 10 + (c - '0');
        if (p > 65535) break;
    }
    if (p < 1 || p > 65535) bad_address(address, "the port must be from 1 to 65535");
    *host = std::string(h);
    *port = static_cast<int>(p);
}

Request classify_request(std::string_view head) {
    std::size_t end = head.find("\r\n\r\n");
    if (end == std::string_view::npos) end = head.find("\n\n");
    if (end == std::string_view::npos) return Request::kIncomplete;
    std::string_view line = head.substr(0, head.find('\n'));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t sp1 = line.find(' ');
    if (sp1 == std::string_view::npos) return Request::kBad;
    std::size_t sp2 = line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) return Request::kBad;
    std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string_view version = line.substr(sp2 + 1);
    if (version.substr(0, 5) != "HTTP/") return Request::kBad;
    std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") return Request::kNotFound;
    if (method == "GET") return Request::kMetrics;
    if (method == "HEAD") return Request::kHeadMetrics;
    return Request::kBadMethod;
}

HttpServer::HttpServer(std::string_view address, HttpLimits limits) : limits_(limits) {
    std::string host;
    int port;
    parse_address(address, &host, &port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string service = std::to_string(port);
    int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) bad_address(address, gai_strerror(rc));
    std::string last_error = "no address";
    for (addrinfo* ai = res; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            last_error = std::strerror(errno);
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (!set_nonblocking(fd) || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
            listen(fd, kListenBacklog) != 0) {
            last_error = std::strerror(errno);
            close(fd);
            continue;
        }
        listen_fd_ = fd;
    }
    freeaddrinfo(res);
    if (listen_fd_ < 0)
        throw Error(sqlstate::kConfigFileError, "could not listen on eventbox.metrics_address \"" +
                                                    std::string(address) + "\": " + last_error);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
        std::string why = std::strerror(errno);
        if (epoll_fd_ >= 0) close(epoll_fd_);
        close(listen_fd_);
        throw Error(sqlstate::kConfigFileError, "could not watch eventbox.metrics_address \"" +
                                                    std::string(address) + "\": " + why);
    }
}

HttpServer::~HttpServer() {
    for (auto& [id, c] : conns_) close(c.fd);
    close(epoll_fd_);
    close(listen_fd_);
}

int64_t HttpServer::next_deadline_ms() const noexcept {
    int64_t next = listen_paused_until_ != 0 ? listen_paused_until_ : INT64_MAX;
    for (const auto& [id, c] : conns_) next = std::min(next, c.deadline_ms);
    return next;
}

std::size_t HttpServer::pending() const noexcept {
    std::size_t n = 0;
    for (const auto& [id, c] : conns_) n += c.state == State::kWaiting ? 1 : 0;
    return n;
}

void HttpServer::set_response(Conn& c, std::string_view status, std::string_view content_type,
                              std::string_view body, int64_t now_ms) {
    c.out = "HTTP/1.1 ";
    c.out += status;
    c.out += "\r\nContent-Type: ";
    c.out += content_type;
    c.out += "\r\nContent-Length: " + std::to_string(body.size());
    c.out += "\r\nConnection: close\r\n\r\n";
    if (!c.head_only) c.out += body;
    c.sent = 0;
    c.state = State::kWriting;
    c.deadline_ms = now_ms + limits_.response_timeout_ms;
}

bool HttpServer::read_some(Conn& c, int64_t now_ms) {
    char buf[2048];
    bool closed = false;
    for (;;) {
        ssize_t n = recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
            c.in.append(buf, static_cast<std::size_t>(n));
            if (c.in.size() > limits_.max_request_bytes) {
                set_response(c, "431 Request Header Fields Too Large", "text/plain",
                             "request too large\n", now_ms);
                return write_some(c);
            }
            continue;
        }
        if (n == 0) {
            closed = true;  // the client's side only: a complete request is still answered
            break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
    }
    Request request = classify_request(c.in);
    switch (request) {
        case Request::kIncomplete:
            return !closed;
        case Request::kMetrics:
        case Request::kHeadMetrics:
            c.head_only = request == Request::kHeadMetrics;
            c.state = State::kWaiting;
            c.deadline_ms = INT64_MAX;  // the owner answers it in its next turn
            ++requests_;
            return true;
        case Request::kNotFound:
            set_response(c, "404 Not Found", "text/plain", "only /metrics is served here\n",
                         now_ms);
            break;
        case Request::kBadMethod:
            set_response(c, "405 Method Not Allowed", "text/plain", "use GET\n", now_ms);
            break;
        case Request::kBad:
            set_response(c, "400 Bad Request", "text/plain", "bad request\n", now_ms);
            break;
    }
    return write_some(c);
}

bool HttpServer::write_some(Conn& c) {
    while (c.sent < c.out.size()) {
        ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
            c.sent += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        return false;
    }
    return false;  // all sent: close
}

void HttpServer::watch(uint64_t id, Conn& c, uint32_t events) {
    if (c.watched == events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    c.watched = events;
}

void HttpServer::settle(Conns::iterator it, bool open) {
    Conn& c = it->second;
    if (!open) {
        close(c.fd);  // also leaves the epoll set: the descriptor is not shared
        conns_.erase(it);
        return;
    }
    // A connection waiting for its body is watched for nothing: only a hang-up or an error
    // (always reported) wakes the owner for it.
    uint32_t events = 0;
    if (c.state == State::kReading) events = EPOLLIN;
    if (c.state == State::kWriting) events = EPOLLOUT;
    watch(it->first, c, events);
}

bool HttpServer::make_room() {
    auto victim = conns_.end();
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->second.state == State::kReading) {
            victim = it;
            break;
        }
        if (it->second.state == State::kWriting && victim == conns_.end()) victim = it;
    }
    if (victim == conns_.end()) return false;  // every one waits for a body the owner sends
    close(victim->second.fd);
    conns_.erase(victim);
    ++evictions_;
    return true;
}

void HttpServer::accept_some(int64_t now_ms) {
    // A bounded batch: a connection accepted now is read again at the next step before as
    // many newer ones could take its place.
    std::size_t batch = std::max<std::size_t>(1, limits_.max_connections / 2);
    for (std::size_t i = 0; i < batch; ++i) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (make_room()) continue;
                epoll_event ev{};
                ev.data.u64 = kListenId;
                (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
                listen_paused_until_ = now_ms + kAcceptPauseMs;
            }
            return;  // EAGAIN: none left
        }
        if (conns_.size() >= limits_.max_connections && !make_room()) {
            close(fd);
            continue;
        }
        uint64_t id = next_id_++;
        auto it = conns_.try_emplace(id, fd, now_ms + limits_.request_timeout_ms).first;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = id;
        if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
            settle(it, false);
            continue;
        }
        it->second.watched = EPOLLIN;
        // Clients send their request with the connection: read it now, so that a scrape waits
        // for its body before newer connections could push it out.
        settle(it, read_some(it->second, now_ms));
    }
}

void HttpServer::step(int64_t now_ms) {
    epoll_event events[kEventsPerStep];
    int n = epoll_wait(epoll_fd_, events, kEventsPerStep, 0);
    bool listen_ready = false;
    for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == kListenId) {
            listen_ready = true;
            continue;
        }
        auto it = conns_.find(events[i].data.u64);
        if (it == conns_.end()) continue;  // closed earlier in this step
        Conn& c = it->second;
        bool open = (events[i].events & (EPOLLHUP | EPOLLERR)) == 0;
        if (c.state == State::kReading)
            open = read_some(c, now_ms);
        else if (c.state == State::kWriting)
            open = write_some(c);
        settle(it, open);
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        if (now_ms >= it->second.deadline_ms) settle(it, false);
        it = next;
    }
    if (listen_paused_until_ != 0 && now_ms >= listen_paused_until_) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenId;
        (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
        listen_paused_until_ = 0;
        listen_ready = true;
    }
    if (listen_ready) accept_some(now_ms);
}

void HttpServer::respond(std::string_view body, int64_t now_ms, std::string_view status) {
    for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        Conn& c = it->second;
        if (c.state == State::kWaiting) {
            if (status.substr(0, 3) == "200")
                set_response(c, status, "text/plain; version=0.0.4; charset=utf-8", body, now_ms);
            else
                set_response(c, status, "text/plain", body, now_ms);
            settle(it, write_some(c));
        }
        it = next;
    }
}

}  // namespace eventbox::metrics
