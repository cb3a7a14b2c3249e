// A tiny non-blocking HTTP/1.x server for GET /metrics (pure C++; no threads). The owner polls
// its sockets (listen_fd() and watches()) in its own wait loop and calls step() when any is
// ready or a deadline passed. A complete GET /metrics request waits in pending() until the owner
// hands the body to respond(); everything else (other paths and methods, oversized or slow
// requests) the server answers or drops by itself. Every connection is closed after one
// response, has a deadline from its accept, and there are at most `max_connections` of them:
// a slow or malicious client holds one slot for at most `timeout_ms`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace eventbox::metrics {

struct HttpLimits {
    std::size_t max_connections = 4;
    std::size_t max_request_bytes = 8192;
    int64_t timeout_ms = 5000;
};

// Parses "host:port" (IPv4 literal or name resolving to IPv4/IPv6; "[v6]:port"). Throws
// eventbox::Error (22023) naming what is wrong.
void parse_address(std::string_view address, std::string* host, int* port);

// What a request's head asks for.
enum class Request { kIncomplete, kMetrics, kHeadMetrics, kNotFound, kBadMethod, kBad };
Request classify_request(std::string_view head);

class HttpServer {
  public:
    // Binds and listens on `address` ("host:port"); throws eventbox::Error on failure.
    HttpServer(std::string_view address, HttpLimits limits);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    int listen_fd() const noexcept { return listen_fd_; }
    // Whether another connection may be accepted now (else leave listen_fd() out of the wait).
    bool accepting() const noexcept { return conns_.size() < limits_.max_connections; }
    struct Watch {
        int fd;
        bool write;  // wait for writability (a response is being sent), else readability
    };
    std::vector<Watch> watches() const;
    // Earliest connection deadline (INT64_MAX when none), on the caller's clock.
    int64_t next_deadline_ms() const noexcept;

    // Accepts, reads, writes and closes what it can without blocking; drops connections past
    // their deadline.
    void step(int64_t now_ms);
    // Connections with a complete GET /metrics request waiting for the body.
    std::size_t pending() const noexcept;
    // Sends `body` (text format 0.0.4) to every pending connection, or `status` (e.g. "503
    // Service Unavailable") with a short text body when it is not 200.
    void respond(std::string_view body, int64_t now_ms, std::string_view status = "200 OK");

    uint64_t requests() const noexcept { return requests_; }

  private:
    struct Conn {
        int fd;
        int64_t deadline_ms;
        std::string in;
        std::string out;
        std::size_t sent = 0;
        bool head_only = false;
        bool waiting = false;  // complete /metrics request, no response yet
    };
    void set_response(Conn& c, std::string_view status, std::string_view content_type,
                      std::string_view body);
    bool read_some(Conn& c);   // false: close it
    bool write_some(Conn& c);  // false: close it (done or failed)

    HttpLimits limits_;
    int listen_fd_ = -1;
    std::vector<Conn> conns_;
    uint64_t requests_ = 0;
};

}  // namespace eventbox::metrics
