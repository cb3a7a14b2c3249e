// A tiny non-blocking HTTP/1.x server for GET /metrics (pure C++; no threads). Its sockets are
// registered in an epoll set of its own: the owner waits for event_fd() to be readable (or for
// next_deadline_ms()) in its own wait loop and calls step(). A complete GET /metrics request
// waits in pending() until the owner hands the body to respond(); everything else (other paths
// and methods, oversized or slow requests) the server answers or drops by itself.
//
// Each connection is a small state machine (reading its request, waiting for the body, writing
// the response) and is closed after one response. Clients cannot keep a scrape out: a request
// must be complete within `request_timeout_ms` of its accept whatever the client sends
// meanwhile, a response must be sent within `response_timeout_ms`, and when
// `max_connections` are open a new connection closes the oldest one still reading its request
// (else the oldest still writing) instead of being refused or left in the listen backlog.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace eventbox::metrics {

struct HttpLimits {
    std::size_t max_connections = 64;
    std::size_t max_request_bytes = 8192;
    int64_t request_timeout_ms = 2000;   // from accept to the request's blank line
    int64_t response_timeout_ms = 5000;  // from the response's start to its last byte
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
    // The epoll set holding the listening socket and every connection: readable when step()
    // has something to do.
    int event_fd() const noexcept { return epoll_fd_; }
    // Earliest deadline of a connection (INT64_MAX when none), on the caller's clock.
    int64_t next_deadline_ms() const noexcept;

    // Reads, writes and closes what is ready without blocking, drops connections past their
    // deadline, and accepts new ones (closing the oldest unanswered ones beyond the cap).
    void step(int64_t now_ms);
    // Connections with a complete GET /metrics request waiting for the body.
    std::size_t pending() const noexcept;
    // Sends `body` (text format 0.0.4) to every pending connection, or `status` (e.g. "503
    // Service Unavailable") with a short text body when it is not 200.
    void respond(std::string_view body, int64_t now_ms, std::string_view status = "200 OK");

    std::size_t connections() const noexcept { return conns_.size(); }
    uint64_t requests() const noexcept { return requests_; }
    // Connections closed to make room for newer ones.
    uint64_t evictions() const noexcept { return evictions_; }

  private:
    enum class State { kReading, kWaiting, kWriting };
    struct Conn {
        Conn(int fd_, int64_t deadline) : fd(fd_), deadline_ms(deadline) {}
        int fd;
        int64_t deadline_ms;
        State state = State::kReading;
        uint32_t watched = 0;  // the epoll events asked for
        std::string in;
        std::string out;
        std::size_t sent = 0;
        bool head_only = false;
    };
    using Conns = std::map<uint64_t, Conn>;  // by accept order: the first is the oldest

    void accept_some(int64_t now_ms);
    bool make_room();
    void watch(uint64_t id, Conn& c, uint32_t events);
    void set_response(Conn& c, std::string_view status, std::string_view content_type,
                      std::string_view body, int64_t now_ms);
    bool read_some(Conn& c, int64_t now_ms);  // false: close it
    bool write_some(Conn& c);                 // false: close it (done or failed)
    // Moves `c` on after a read or write; closes it when `open` is false.
    void settle(Conns::iterator it, bool open);

    HttpLimits limits_;
    int listen_fd_ = -1;
    int epoll_fd_ = -1;
    int64_t listen_paused_until_ = 0;  // after running out of descriptors
    Conns conns_;
    uint64_t next_id_ = 0;
    uint64_t requests_ = 0;
    uint64_t evictions_ = 0;
};

}  // namespace eventbox::metrics
