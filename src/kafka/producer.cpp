// librdkafka producer wrapper (see kafka/producer.hpp).
#include "kafka/producer.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "messages/message_rules.hpp"

namespace eventbox::kafka {

Producer::Producer(const ProducerConfig& config) {
    std::vector<KafkaOption> ours = {
        {"enable.idempotence", "true"},
        {"acks", "all"},
        // Same key -> same partition as the Java client, so mixed producers agree.
        {"partitioner", "murmur2_random"},
        {"linger.ms", std::to_string(config.linger_ms)},
        {"message.timeout.ms", std::to_string(config.message_timeout_ms)},
        {"queue.buffering.max.messages",
         std::to_string(std::max(config.max_in_flight_messages * 2, 1000))},
        {"client.id", "pg_eventbox-relay"},
        // Headroom for record framing: whatever send() accepted is never refused locally.
        {"message.max.bytes", std::to_string(std::max(config.max_message_bytes + 65536, 1000000))},
    };
    rd_kafka_conf_t* conf = new_conf(config.brokers, ours, config.options);
    rd_kafka_conf_set_dr_msg_cb(conf, &Producer::on_delivery);

    rk_ = new_handle(RD_KAFKA_PRODUCER, conf, "producer");
    rd_kafka_set_log_queue(rk_, nullptr);
    rd_kafka_queue_t* main_queue = rd_kafka_queue_get_main(rk_);
    try {
        enable_queue_events(main_queue);
    } catch (...) {
        rd_kafka_queue_destroy(main_queue);
        rd_kafka_destroy(rk_);
        rk_ = nullptr;
        throw;
    }
    rd_kafka_queue_destroy(main_queue);
}

Producer::~Producer() {
    if (rk_ != nullptr) {
        rd_kafka_queue_t* main_queue = rd_kafka_queue_get_main(rk_);
        disable_queue_events(main_queue);
        rd_kafka_queue_destroy(main_queue);
        rd_kafka_purge(rk_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        for (auto& entry : topics_) rd_kafka_topic_destroy(entry.second);
        rd_kafka_destroy(rk_);
    }
    close_pipe();
}

rd_kafka_topic_t* Producer::topic(std::string_view name) {
    std::string key(name);
    auto it = topics_.find(key);
    if (it != topics_.end()) return it->second;
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_, key.c_str(), nullptr);
    if (rkt != nullptr) topics_.emplace(std::move(key), rkt);
    return rkt;
}

relay::Produced Producer::produce(const relay::Row& row, std::string& error) {
    rd_kafka_topic_t* rkt = topic(row.topic);
    if (rkt == nullptr) {
        rd_kafka_resp_err_t err = rd_kafka_last_error();
        error = std::string("could not use topic: ") + rd_kafka_err2str(err);
        return relay::Produced::kFailed;
    }
    rd_kafka_headers_t* headers = rd_kafka_headers_new(row.n_headers + 1);
    rd_kafka_header_add(headers, kMessageIdHeader.data(), kMessageIdHeader.size(),
                        row.message_id.data(), row.message_id.size());
    for (std::size_t i = 0; i < row.n_headers; ++i)
        rd_kafka_header_add(headers, row.headers[i].name.data(), row.headers[i].name.size(),
                            row.headers[i].value.data(), row.headers[i].value.size());

    rd_kafka_resp_err_t err = rd_kafka_producev(
        rk_, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_VALUE(const_cast<char*>(row.payload), row.payload_len),
        RD_KAFKA_V_KEY(row.key, row.key_len), RD_KAFKA_V_HEADERS(headers),
        RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<intptr_t>(row.id))), RD_KAFKA_V_END);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return relay::Produced::kQueued;
    rd_kafka_headers_destroy(headers);  // not taken over on failure
    error = std::string(rd_kafka_err2name(err)) + ": " + rd_kafka_err2str(err);
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) return relay::Produced::kBusy;
    return is_permanent(err) ? relay::Produced::kFailedPermanently : relay::Produced::kFailed;
}

void Producer::poll() {
    drain_pipe();
    rd_kafka_poll(rk_, 0);
    rethrow_deferred();
}

void Producer::purge() {
    rd_kafka_purge(rk_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
}

bool Producer::is_permanent(rd_kafka_resp_err_t err) {
    switch (err) {
        case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_INVALID_MSG:
        case RD_KAFKA_RESP_ERR_INVALID_RECORD:
        case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
        case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
        case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
        case RD_KAFKA_RESP_ERR__INVALID_ARG:
            return true;
        default:
            return false;
    }
}

void Producer::on_delivery(rd_kafka_t*, const rd_kafka_message_t* msg, void* opaque) {
    // The handle's opaque is the ClientEvents base of this producer.
    auto* self = static_cast<Producer*>(static_cast<ClientEvents*>(opaque));
    rd_kafka_resp_err_t err = msg->err;
    bool purged = err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
    // A report not recorded (no memory) leaves its row in flight: the rethrown error restarts
    // the relay, which reads the row again (at least once).
    self->in_callback([&] {
        self->deliveries_.push_back(
            Delivery{static_cast<int64_t>(reinterpret_cast<intptr_t>(msg->_private)),
                     static_cast<int>(err), is_permanent(err), !purged, msg->partition, msg->offset,
                     err == RD_KAFKA_RESP_ERR_NO_ERROR
                         ? std::string()
                         : std::string(rd_kafka_err2name(err)) + ": " + rd_kafka_err2str(err)});
    });
}

}  // namespace eventbox::kafka
