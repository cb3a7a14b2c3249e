// Non-blocking HTTP server for GET /metrics (see metrics/http_server.hpp).
#include "metrics/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/error.hpp"

namespace eventbox::metrics {

namespace {

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
            listen(fd, 16) != 0) {
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
}

HttpServer::~HttpServer() {
    for (Conn& c : conns_) close(c.fd);
    if (listen_fd_ >= 0) close(listen_fd_);
}

std::vector<HttpServer::Watch> HttpServer::watches() const {
    std::vector<Watch> out;
    for (const Conn& c : conns_)
        if (!c.waiting) out.push_back(Watch{c.fd, !c.out.empty()});
    return out;
}

int64_t HttpServer::next_deadline_ms() const noexcept {
    int64_t next = INT64_MAX;
    for (const Conn& c : conns_) next = std::min(next, c.deadline_ms);
    return next;
}

std::size_t HttpServer::pending() const noexcept {
    std::size_t n = 0;
    for (const Conn& c : conns_) n += c.waiting ? 1 : 0;
    return n;
}

void HttpServer::set_response(Conn& c, std::string_view status, std::string_view content_type,
                              std::string_view body) {
    c.out = "HTTP/1.1 ";
    c.out += status;
    c.out += "\r\nContent-Type: ";
    c.out += content_type;
    c.out += "\r\nContent-Length: " + std::to_string(body.size());
    c.out += "\r\nConnection: close\r\n\r\n";
    if (!c.head_only) c.out += body;
    c.sent = 0;
    c.waiting = false;
}

bool HttpServer::read_some(Conn& c) {
    char buf[2048];
    for (;;) {
        ssize_t n = recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
            c.in.append(buf, static_cast<std::size_t>(n));
            if (c.in.size() > limits_.max_request_bytes) {
                set_response(c, "431 Request Header Fields Too Large", "text/plain",
                             "request too large\n");
                return true;
            }
            continue;
        }
        if (n == 0) return false;  // closed before a complete request
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
    }
    switch (classify_request(c.in)) {
        case Request::kIncomplete:
            break;
        case Request::kMetrics:
            c.waiting = true;
            ++requests_;
            break;
        case Request::kHeadMetrics:
            c.head_only = true;
            c.waiting = true;
            ++requests_;
            break;
        case Request::kNotFound:
            set_response(c, "404 Not Found", "text/plain", "only /metrics is served here\n");
            break;
        case Request::kBadMethod:
            set_response(c, "405 Method Not Allowed", "text/plain", "use GET\n");
            break;
        case Request::kBad:
            set_response(c, "400 Bad Request", "text/plain", "bad request\n");
            break;
    }
    return true;
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

void HttpServer::step(int64_t now_ms) {
    while (accepting()) {
        int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) break;  // EAGAIN, or an error the next step retries
        if (!set_nonblocking(fd)) {
            close(fd);
            continue;
        }
        conns_.push_back(Conn{fd, now_ms + limits_.timeout_ms, {}, {}, 0, false, false});
    }
    std::vector<Conn> keep;
    keep.reserve(conns_.size());
    for (Conn& c : conns_) {
        bool open = now_ms < c.deadline_ms;
        if (open && !c.waiting && c.out.empty()) open = read_some(c);
        if (open && !c.out.empty()) open = write_some(c);
        if (open)
            keep.push_back(std::move(c));
        else
            close(c.fd);
    }
    conns_ = std::move(keep);
}

void HttpServer::respond(std::string_view body, int64_t now_ms, std::string_view status) {
    for (Conn& c : conns_) {
        if (!c.waiting) continue;
        if (status.substr(0, 3) == "200")
            set_response(c, status, "text/plain; version=0.0.4; charset=utf-8", body);
        else
            set_response(c, status, "text/plain", body);
    }
    step(now_ms);
}

}  // namespace eventbox::metrics
