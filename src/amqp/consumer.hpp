// The ingest worker's RabbitMQ side: the queues of its AMQP subscriptions (source 'amqp'),
// consumed on one connection with a channel per subscription (librabbitmq). Manual
// acknowledgements only, a prefetch bound (basic.qos = the subscription's batch size): the
// worker acknowledges a batch (basic.ack multiple, up to its last delivery tag) only after its
// inbox transaction committed. Streams (x-queue-type: stream) are consumed from a stored offset
// (x-stream-offset); a queue that refuses that argument is a plain queue, consumed without it.
// Pure C++: no thread, the socket (fd()) is waited on by the worker's WaitEventSet; connecting
// and each setup call block at most connect_timeout, at most once per reconnect backoff.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <amqp.h>

#include "amqp/settings.hpp"
#include "inbox/record.hpp"

namespace eventbox::amqp {

// One delivery as read: its properties, headers (values as text; nullopt: void) and body.
struct Delivery {
    uint64_t tag = 0;
    bool redelivered = false;
    std::string queue;
    std::string routing_key;
    int64_t stream_offset = -1;  // the x-stream-offset header of a stream's delivery
    std::optional<std::string> message_id, type, content_type;
    std::vector<std::pair<std::string, std::optional<std::string>>> headers;
    std::string body;
};

struct ConsumerSubscription {
    std::string name;
    std::vector<std::string> queues;
    int prefetch = 1000;      // basic.qos: unacknowledged deliveries at most
    bool start_first = true;  // a stream without stored offset: 'first' (else 'next')
};

// A delivery's properties into `d`: message_id, type, content_type, the headers whose values
// have a text form (void: nullopt; tables and arrays left out) and a stream's x-stream-offset
// header as stream_offset (not a header).
void read_properties(const amqp_basic_properties_t& p, Delivery& d);
// An x-stream-offset value: a signed or unsigned integer of 32 or 64 bits; -1 for any other
// kind or an unsigned value beyond int64.
int64_t stream_offset_of(const amqp_field_value_t& v);

// The delivery's headers as the inbox's rules read them (inbox/record.hpp): the message_id
// property as the header message_id (replacing one of that name: the property is the message
// id), the type property as event_type unless a header gives one; into `out` (views into `d`).
void record_headers(const Delivery& d, std::vector<inbox::KafkaHeader>& out);

class Consumer {
  public:
    explicit Consumer(Settings settings);
    ~Consumer();
    Consumer(const Consumer&) = delete;
    Consumer& operator=(const Consumer&) = delete;

    int add(ConsumerSubscription config);
    void remove(int id);
    // Where a stream is read from when (re)consumed: the stored next offset.
    void set_next_offset(int id, const std::string& queue, int64_t next);
    // Cancels the subscription's consumers and consumes again from set_next_offset() (after a
    // failed batch, or an offset moved by eventbox.replay()): unacknowledged deliveries go back
    // to their queues.
    void restart(int id, int64_t delay_ms, int64_t now_ms);

    // The socket (-1 while not connected).
    int fd() const noexcept;
    // Frames read from the socket and not yet handled (then fd() may not become readable).
    bool buffered() const noexcept;
    // Connects and opens channels when due; reads what arrived, up to `max` deliveries in all
    // (kept per subscription in batch()).
    std::size_t poll(int64_t now_ms, std::size_t max);
    std::vector<Delivery>& batch(int id) { return subs_.at(id).batch; }
    // Acknowledges the subscription's batch (basic.ack multiple up to its last tag), unless the
    // channel it came on is gone (then the broker redelivers it), and empties it.
    void ack_batch(int id);
    void clear_batch(int id) { subs_.at(id).batch.clear(); }
    // Why the subscription does not consume ("" when it does or is about to); the user and
    // password never appear in it (redacted()).
    const std::string& error(int id) const { return subs_.at(id).error; }
    const std::string& last_error() const noexcept { return last_error_; }
    // Milliseconds until the next reconnect or channel retry is due (-1: none).
    long timeout_ms(int64_t now_ms) const noexcept;

  private:
    struct Queue {
        std::string name;
        int stream = -1;  // unknown; 1: a stream; 0: refuses x-stream-offset
        int64_t next_offset = -1;
    };
    struct Sub {
        ConsumerSubscription config;
        std::vector<Queue> queues;
        int channel = 0;  // 0: no channel open
        int64_t open_at_ms = 0;
        int64_t backoff_ms = 0;
        std::string error;
        std::vector<Delivery> batch;
        uint64_t batch_channel_epoch = 0;  // the channel the batch's tags belong to
        uint64_t epoch = 0;                // channel epoch
        // A delivery whose header and body frames are still to come.
        bool pending = false;
        Delivery partial;
        uint64_t body_left = 0;
    };

    bool connect(int64_t now_ms);
    void disconnect(const std::string& why);
    bool open(Sub& sub, int64_t now_ms);
    void close_channel(Sub& sub, const std::string& why, int64_t now_ms);
    Sub* by_channel(int channel);
    bool read_frames(std::size_t max, std::size_t* read);

    Settings settings_;
    std::map<int, Sub> subs_;
    int next_id_ = 1;
    int next_channel_ = 1;
    uint64_t next_epoch_ = 1;
    void* conn_ = nullptr;  // amqp_connection_state_t
    int64_t reconnect_at_ms_ = 0;
    int64_t reconnect_delay_ms_ = 0;
    std::string last_error_;
};

}  // namespace eventbox::amqp
