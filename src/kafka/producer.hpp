// The relay's librdkafka producer: idempotent, acks=all, Java-compatible key partitioning.
// Callbacks (delivery reports, logs, errors) are served only from poll() on the caller's thread
// and recorded here; librdkafka's own threads never reach the caller. Pure C++.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kafka/client.hpp"
#include "outbox/relay_dispatch.hpp"

namespace eventbox::kafka {

struct ProducerConfig {
    std::string brokers;
    std::vector<KafkaOption> options;  // user options, applied after our defaults
    // 0: librdkafka retries until delivered. The idempotent producer keeps a partition's order
    // through retries, but a message that times out in flight leaves a gap that later messages
    // of its key fill first; without timeouts there are no such gaps.
    int message_timeout_ms = 0;
    int linger_ms = 5;
    int max_in_flight_messages = 10000;
    // eventbox.max_message_bytes: librdkafka's own limit gets headroom for record framing, so
    // that whatever send() accepted is never refused locally.
    int max_message_bytes = 1000000;
};

struct Delivery {
    int64_t id;
    int err;  // rd_kafka_resp_err_t
    bool permanent;
    bool counts;  // false for purges, which are not delivery attempts
    int32_t partition;
    int64_t offset;
    std::string error;
};

class Producer final : public relay::Sink, public ClientEvents {
  public:
    // Throws eventbox::Error when a configuration property is rejected (naming the key only).
    explicit Producer(const ProducerConfig& config);
    ~Producer() override;
    Producer(const Producer&) = delete;
    Producer& operator=(const Producer&) = delete;

    relay::Produced produce(const relay::Row& row, std::string& error) override;

    // File descriptor that becomes readable when librdkafka queues an event on an empty queue:
    // call poll() once after creating the producer, then after each wake-up.
    int event_fd() const noexcept { return pipe_[0]; }
    // Drains the wake-up pipe and serves all queued callbacks.
    void poll();

    std::vector<Delivery>& deliveries() noexcept { return deliveries_; }
    // Stops waiting for queued and in-flight messages (they are reported as purged).
    void purge();

    // Whether retrying a delivery that failed with `err` can ever succeed.
    static bool is_permanent(rd_kafka_resp_err_t err);

  private:
    static void on_delivery(rd_kafka_t*, const rd_kafka_message_t* msg, void* opaque);
    rd_kafka_topic_t* topic(std::string_view name);

    rd_kafka_t* rk_ = nullptr;
    std::unordered_map<std::string, rd_kafka_topic_t*> topics_;
    std::vector<Delivery> deliveries_;
};

}  // namespace eventbox::kafka
