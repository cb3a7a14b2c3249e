// The relay's RabbitMQ side: outbox rows of topics with an AMQP destination are published to
// the destination's exchange on one connection and channel (librabbitmq), persistent and
// mandatory, with publisher confirms. A row is delivered when the broker acknowledged its
// publish (confirm before mark); a nack, a lost connection or a confirm that does not come in
// time fail it as a transient error (the dispatcher retries it with backoff, with the same
// message_id); a returned (unroutable) publish fails it as a permanent error with the broker's
// reply code and text (given up after eventbox.relay_max_attempts). Pure C++: no thread, the
// socket (fd()) is waited on by the relay's WaitEventSet; connecting blocks at most
// connect_timeout per step and happens at most once per reconnect backoff.
//
// Per-key order: a key has at most one publish unconfirmed; its later rows queue behind it
// here. When a publish fails, the rows queued behind it are handed back uncounted, so the
// dispatcher holds them behind the failed one (as http::Client does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "amqp/settings.hpp"
#include "outbox/relay_dispatch.hpp"

namespace eventbox::amqp {

struct Destination {
    std::string topic;
    std::string exchange;
    std::string routing_key;
    bool key_routes = true;  // routing_key NULL: the message key is the routing key
};

// The end of one publish, for the dispatcher.
struct Outcome {
    int64_t id;
    bool delivered;  // the broker confirmed it and did not return it
    bool permanent;  // returned (unroutable): counts toward eventbox.relay_max_attempts
    bool counts;     // false: never published (held back behind a failed row of its key)
    std::string error;
};

// Builds the AMQP properties of a row: the event type is the header event_type, the content
// type application/json for JSON payloads, else application/octet-stream.
std::string_view event_type_of(const relay::Row& row);

class Publisher final : public relay::Sink {
  public:
    // `queue_limit`: rows this publisher may hold (unconfirmed and queued behind a key);
    // beyond it produce() answers kBusy.
    Publisher(Settings settings, std::vector<Destination> destinations, std::size_t queue_limit);
    ~Publisher() override;
    Publisher(const Publisher&) = delete;
    Publisher& operator=(const Publisher&) = delete;

    // Without a usable eventbox.amqp_url or amqp_options: every row of the destinations fails
    // at once with `why` as its error (a transient failure: retried with backoff, never given
    // up), so that it stays pending with the reason in its last_error.
    void refuse_all(std::string why) { refused_ = std::move(why); }

    int destination_of(std::string_view topic) const;
    relay::Produced produce(const relay::Row& row, std::string& error) override;

    // The connection's socket (-1 while not connected): readable when confirms arrive.
    int fd() const noexcept;
    // Reads what the broker sent (confirms, returns, closes) and fails publishes whose confirm
    // is overdue.
    void poll(int64_t now_ms);
    // Milliseconds until the oldest unconfirmed publish is overdue (-1: none).
    long timeout_ms(int64_t now_ms) const noexcept;
    std::vector<Outcome>& outcomes() noexcept { return outcomes_; }
    // Sends what the publishes since the last flush wrote: they are held back (TCP_CORK) so
    // that a burst of publishes leaves in full segments. Call before waiting.
    void flush();
    std::size_t unconfirmed() const noexcept { return by_tag_.size(); }
    // Why the last connection attempt or connection failed ("" when connected).
    const std::string& last_error() const noexcept { return last_error_; }

  private:
    struct Message {
        int64_t id;
        std::size_t destination;
        std::string message_id;
        bool has_key;
        std::string key;
        std::string payload;
        std::vector<std::pair<std::string, std::string>> headers;
        uint64_t tag = 0;
        int64_t published_ms = 0;
        int return_code = 0;
        std::string return_text;
    };

    bool connect(int64_t now_ms);
    void disconnect(const std::string& why);
    void publish(Message* m, int64_t now_ms);
    void cork(bool on);
    void settle(Message* m, bool delivered, bool permanent, const std::string& error);
    void release_key(Message* m, bool delivered, int64_t now_ms);
    void on_confirm(uint64_t tag, bool multiple, bool ack);
    bool read_frames(int64_t now_ms);

    Settings settings_;
    std::vector<Destination> destinations_;
    std::unordered_map<std::string, std::size_t> by_topic_;
    std::size_t queue_limit_;
    std::size_t held_ = 0;
    void* conn_ = nullptr;  // amqp_connection_state_t
    bool corked_ = false;   // TCP_CORK set on the socket since the last flush()
    bool blocked_ = false;  // connection.blocked: the broker refuses publishes for now
    uint64_t next_tag_ = 1;
    int64_t reconnect_at_ms_ = 0;
    int64_t reconnect_delay_ms_ = 0;
    std::string last_error_;
    std::string refused_;                  // refuse_all()
    std::map<uint64_t, Message*> by_tag_;  // unconfirmed, by delivery tag
    std::unordered_map<std::string, Message*> by_message_id_;
    std::unordered_map<std::string, std::deque<Message*>> keys_;  // behind an unconfirmed row
    // A basic.return whose content header (with the message_id) is still to come.
    int pending_return_code_ = 0;
    std::string pending_return_text_;
    std::vector<Outcome> outcomes_;
};

// Routes each row to its AMQP destination, or on to `next` (HTTP destinations, Kafka).
class Router final : public relay::Sink {
  public:
    Router(relay::Sink& next, Publisher& amqp) : next_(next), amqp_(amqp) {}
    relay::Produced produce(const relay::Row& row, std::string& error) override {
        if (amqp_.destination_of(row.topic) >= 0) return amqp_.produce(row, error);
        return next_.produce(row, error);
    }

  private:
    relay::Sink& next_;
    Publisher& amqp_;
};

}  // namespace eventbox::amqp
