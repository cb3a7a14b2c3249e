// The relay's HTTP side: outbox rows of topics with an HTTP destination become requests, sent
// with libcurl's multi interface (non-blocking, kept-alive connections, HTTP/2 where a TLS server
// offers it). The sockets are registered in an epoll set of our own whose fd the relay adds to
// its WaitEventSet, next to its latch and librdkafka's fd; curl's timer becomes the wait's
// timeout. Nothing here blocks and no thread is started. Pure C++.
//
// Per-key order: a key has at most one row open; its later rows queue behind it here. When a
// row fails, the rows queued behind it are handed back uncounted, so the dispatcher holds them
// behind the failed one (relay::Dispatcher keeps the order of a lane across retries). A bulk
// destination puts several ready rows (so each key at most once) in one request and settles
// each row from the response (outbox/http_bulk.hpp); requests start only as the destination's
// rate limits and circuit breaker allow (outbox/http_limits.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "outbox/http_bulk.hpp"
#include "outbox/http_limits.hpp"
#include "outbox/http_text.hpp"
#include "outbox/relay_dispatch.hpp"

namespace eventbox::http {

// Prefix of the request headers that carry the message's own headers.
inline constexpr std::string_view kHeaderPrefix = "Eventbox-Header-";
struct Destination {
    std::string topic;
    std::string url;
    std::string method;                                        // POST, PUT or PATCH
    std::vector<std::pair<std::string, std::string>> headers;  // credentials: never logged
    int64_t timeout_ms = 10000;
    std::size_t max_in_flight = 32;
    int metrics_slot = -1;  // its counters in shared memory (the relay fills this in)
    // Bulk requests (outbox/http_bulk.hpp): up to batch_size messages a request, a request
    // started when it is full or its oldest message waited batch_wait_ms. 1: one message a
    // request, the payload as the body.
    std::size_t batch_size = 1;
    int64_t batch_wait_ms = 100;
    BatchFormat batch_format = BatchFormat::kJsonArray;
    std::vector<std::string> signing_keys;  // Standard Webhooks keys (decoded): never logged
    // Rate limits (outbox/http_limits.hpp), 0: none; and the circuit breaker, 0: none.
    double rate_limit = 0;  // requests per second
    double rate_burst = 1;  // requests
    double max_messages_per_second = 0;
    int breaker_failures = 0;
    int64_t breaker_cooldown_ms = 30000;
};

// The end of one request, for the dispatcher and the metrics.
struct Outcome {
    int64_t id;
    std::size_t destination;  // index in the client's destinations
    bool delivered;           // 2xx
    bool permanent;           // another 4xx (or 1xx/3xx): retrying cannot help
    bool counts;              // false: never sent (held back behind a failed row of its key)
    int status;               // HTTP status, 0 when there was no response
    int64_t retry_after_ms;   // from Retry-After (0 when absent)
    int64_t latency_us;       // request start to end (0 when never sent)
    std::string error;        // for last_error: status and body excerpt, or curl's reason
    bool request;             // the first outcome of a request (counts it in the metrics)
    int64_t created_ms;       // the row's created_at (epoch ms), for the delivery histogram
};

class Client final : public relay::Sink {
  public:
    // `queue_limit`: rows all destinations together may hold (open and queued), in equal shares
    // (at least each one's max_in_flight). Beyond its share produce() answers kBusy; the
    // dispatcher then parks the row (its id only) and re-reads it later, so destinations that
    // hang never take more than that of the relay's capacity.
    Client(std::vector<Destination> destinations, std::size_t queue_limit);
    ~Client() override;
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // Index of the destination of `topic`, or -1.
    int destination_of(std::string_view topic) const;
    relay::Produced produce(const relay::Row& row, std::string& error) override;

    // The epoll fd to wait on (readable when a socket is ready).
    int event_fd() const noexcept { return epoll_fd_; }
    // Milliseconds until curl's next timeout or a bulk request's batch_wait ends (-1: none).
    long timeout_ms(int64_t now_ms) const noexcept;
    // Serves ready sockets and due timeouts, starts queued requests, collects finished ones.
    void poll(int64_t now_ms);
    std::vector<Outcome>& outcomes() noexcept { return outcomes_; }
    const std::vector<Destination>& destinations() const noexcept { return destinations_; }
    // The circuit breaker of destination `index`.
    Breaker& breaker(std::size_t index) noexcept { return queues_[index].breaker; }
    std::size_t open_requests() const noexcept;

  private:
    struct Item;     // one row
    struct Request;  // one HTTP request: one row, or a bulk request of several
    struct Queue {
        TokenBucket requests;  // rate_limit
        TokenBucket messages;  // max_messages_per_second
        Breaker breaker;
        int64_t paused_until_ms = 0;  // limit headers or Retry-After: no new request before
        std::size_t active = 0;       // requests open
        std::size_t held = 0;         // rows open, ready or behind a key
        std::deque<Item*> ready;      // may start now (oldest first)
        std::unordered_map<std::string, std::deque<Item*>> keys;  // behind an open row
    };

    static int on_socket(void* easy, int fd, int what, void* self, void* socket_data);
    static int on_timer(void* multi, long timeout_ms, void* self);
    void start_ready();
    // When destination `i` may start its next request: 0 now, -1 not by time (nothing ready,
    // or max_in_flight reached), else the steady-clock ms.
    int64_t next_start_ms(std::size_t i, int64_t now) const noexcept;
    Request* make_request(std::size_t dest, std::vector<Item*> items);
    void start(Request* r);
    void finish(Request* r, int curl_code, int64_t now_ms);
    void settle(Request* r, int curl_code, std::vector<Outcome>& out);
    void release_key(std::size_t dest, Item* item, bool delivered);
    void drive(int fd, int mask);

    std::vector<Destination> destinations_;
    std::unordered_map<std::string, std::size_t> by_topic_;
    std::vector<Queue> queues_;
    std::size_t queue_limit_;
    void* multi_ = nullptr;  // CURLM*
    int epoll_fd_ = -1;
    int64_t timer_due_ms_ = -1;
    std::vector<Outcome> outcomes_;
    std::vector<Request*> open_;
};

// Routes each row to its HTTP destination or to Kafka.
class Router final : public relay::Sink {
  public:
    Router(relay::Sink& kafka, Client& http) : kafka_(kafka), http_(http) {}
    relay::Produced produce(const relay::Row& row, std::string& error) override {
        if (http_.destination_of(row.topic) >= 0) return http_.produce(row, error);
        return kafka_.produce(row, error);
    }

  private:
    relay::Sink& kafka_;
    Client& http_;
};

}  // namespace eventbox::http
