// One subscription's librdkafka consumer (see kafka_consumer.hpp).
#include "kafka_consumer.hpp"

#include <algorithm>
#include <cstring>

#include "error.hpp"

namespace eventbox::kafka {

Consumer::Consumer(const ConsumerConfig& config) : start_latest_(config.start_latest) {
    std::vector<KafkaOption> ours = {
        {"group.id", config.group_id},
        {"client.id", "pg_eventbox-ingest"},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", config.start_latest ? "latest" : "earliest"},
        {"enable.partition.eof", "false"},
        // Bound what librdkafka prefetches for us.
        {"queued.max.messages.kbytes", "16384"},
        // A broker without data answers a fetch after at most this long; brokers that answer as
        // soon as data arrives (real Kafka) are unaffected, others then add at most this latency.
        {"fetch.wait.max.ms", "100"},
    };
    rd_kafka_conf_t* conf = new_conf(config.brokers, ours, config.options);
    rd_kafka_conf_set_rebalance_cb(conf, &Consumer::on_rebalance);

    char errstr[512];
    rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (rk_ == nullptr) {
        rd_kafka_conf_destroy(conf);
        throw Error(sqlstate::kConfigFileError, "could not create the Kafka consumer",
                    scrubber_.scrub(errstr));
    }
    // Logs, errors and rebalances all arrive on the consumer queue, served by poll().
    rd_kafka_poll_set_consumer(rk_);
    queue_ = rd_kafka_queue_get_consumer(rk_);
    try {
        enable_queue_events(queue_);
        rd_kafka_topic_partition_list_t* topics =
            rd_kafka_topic_partition_list_new(static_cast<int>(config.topics.size()));
        for (const std::string& topic : config.topics)
            rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t err = rd_kafka_subscribe(rk_, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            throw Error(sqlstate::kInternalError, "could not subscribe the Kafka consumer",
                        rd_kafka_err2str(err));
    } catch (...) {
        disable_queue_events(queue_);
        rd_kafka_queue_destroy(queue_);
        rd_kafka_destroy(rk_);
        close_pipe();
        throw;
    }
}

Consumer::~Consumer() {
    free_messages();
    disable_queue_events(queue_);
    rd_kafka_queue_destroy(queue_);
    // Leave the group cleanly so a successor is assigned at once; then destroy.
    rd_kafka_consumer_close(rk_);
    rd_kafka_destroy(rk_);
    close_pipe();
}

void Consumer::set_stored_offset(const std::string& topic, int32_t partition,
                                 int64_t next_offset) {
    stored_[{topic, partition}] = next_offset;
}

void Consumer::seek_to_stored() {
    rd_kafka_topic_partition_list_t* assigned = nullptr;
    if (rd_kafka_assignment(rk_, &assigned) != RD_KAFKA_RESP_ERR_NO_ERROR || assigned == nullptr)
        return;
    for (int i = 0; i < assigned->cnt; ++i) {
        rd_kafka_topic_partition_t& tp = assigned->elems[i];
        auto it = stored_.find({tp.topic, tp.partition});
        tp.offset = it != stored_.end() ? it->second
                                        : (start_latest_ ? RD_KAFKA_OFFSET_END
                                                         : RD_KAFKA_OFFSET_BEGINNING);
    }
    if (assigned->cnt > 0) {
        rd_kafka_error_t* error = rd_kafka_seek_partitions(rk_, assigned, 5000);
        if (error != nullptr) {
            logs_.push_back(LogLine{4, std::string("seek failed: ") + rd_kafka_error_string(error)});
            rd_kafka_error_destroy(error);
        }
    }
    rd_kafka_topic_partition_list_destroy(assigned);
}

int64_t Consumer::stored_offset(const std::string& topic, int32_t partition) const {
    auto it = stored_.find({topic, partition});
    return it == stored_.end() ? -1 : it->second;
}

void Consumer::on_rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                            rd_kafka_topic_partition_list_t* partitions, void* opaque) {
    auto* self = static_cast<Consumer*>(static_cast<ClientEvents*>(opaque));
    bool cooperative = std::strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        // Start where the database says, not where Kafka's committed offsets say.
        for (int i = 0; i < partitions->cnt; ++i) {
            rd_kafka_topic_partition_t& tp = partitions->elems[i];
            auto it = self->stored_.find({tp.topic, tp.partition});
            if (it != self->stored_.end()) {
                tp.offset = it->second;
            } else if (!self->start_latest_) {
                tp.offset = RD_KAFKA_OFFSET_BEGINNING;
            } else {
                // Pin "latest" to a concrete offset, to be stored before anything else happens.
                int64_t low = -1, high = -1;
                rd_kafka_resp_err_t qerr =
                    rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, 5000);
                if (qerr == RD_KAFKA_RESP_ERR_NO_ERROR) {
                    tp.offset = high;
                    self->stored_[{tp.topic, tp.partition}] = high;
                    self->initial_.push_back(PartitionEnd{tp.topic, tp.partition, high, high});
                } else {
                    tp.offset = RD_KAFKA_OFFSET_END;
                    self->logs_.push_back(LogLine{4, std::string("could not resolve the end of ") +
                                                         tp.topic + "[" + std::to_string(tp.partition) +
                                                         "]: " + rd_kafka_err2str(qerr)});
                }
            }
        }
        if (cooperative) {
            rd_kafka_error_t* error = rd_kafka_incremental_assign(rk, partitions);
            if (error) rd_kafka_error_destroy(error);
            self->assigned_ += static_cast<std::size_t>(partitions->cnt);
        } else {
            rd_kafka_assign(rk, partitions);
            self->assigned_ = static_cast<std::size_t>(partitions->cnt);
        }
        self->logs_.push_back(LogLine{6, "assigned " + std::to_string(partitions->cnt) +
                                             " partition(s)"});
    } else {
        // Revoked (or a rebalance error): drop the assignment; the batch read so far is still
        // written, deduplicated by message id.
        self->revoked_ = true;
        if (cooperative) {
            rd_kafka_error_t* error = rd_kafka_incremental_unassign(rk, partitions);
            if (error) rd_kafka_error_destroy(error);
            self->assigned_ -= std::min(self->assigned_, static_cast<std::size_t>(partitions->cnt));
        } else {
            rd_kafka_assign(rk, nullptr);
            self->assigned_ = 0;
        }
        if (err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS)
            self->logs_.push_back(LogLine{4, std::string("rebalance error: ") + rd_kafka_err2str(err)});
    }
}

std::size_t Consumer::poll(std::size_t max) {
    drain_pipe();
    revoked_ = false;
    while (messages_.size() < max && !revoked_) {
        rd_kafka_message_t* msg = rd_kafka_consumer_poll(rk_, 0);
        if (msg == nullptr) break;
        if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            std::string where = msg->rkt ? std::string(rd_kafka_topic_name(msg->rkt)) + "[" +
                                               std::to_string(msg->partition) + "]: "
                                         : std::string();
            logs_.push_back(LogLine{4, "consumer error: " + where + rd_kafka_message_errstr(msg)});
            rd_kafka_message_destroy(msg);
            continue;
        }
        messages_.push_back(msg);
    }
    return messages_.size();
}

const std::vector<PartitionEnd>& Consumer::partition_ends() {
    std::map<std::pair<std::string, int32_t>, int64_t> ends;
    for (const PartitionEnd& initial : initial_)
        ends[{initial.topic, initial.partition}] = initial.next_offset;
    for (rd_kafka_message_t* msg : messages_) {
        int64_t& next = ends[{rd_kafka_topic_name(msg->rkt), msg->partition}];
        next = std::max(next, msg->offset + 1);
    }
    ends_.clear();
    for (auto& [tp, next] : ends) {
        int64_t low = -1, high = -1;
        rd_kafka_get_watermark_offsets(rk_, tp.first.c_str(), tp.second, &low, &high);
        int64_t previous = stored_offset(tp.first, tp.second);
        // A pinned initial position is not stored yet: there is nothing to compare with.
        for (const PartitionEnd& initial : initial_)
            if (initial.topic == tp.first && initial.partition == tp.second) previous = -1;
        ends_.push_back(PartitionEnd{tp.first, tp.second, next, high, previous});
    }
    return ends_;
}

void Consumer::committed() {
    partition_ends();
    if (!ends_.empty()) {
        rd_kafka_topic_partition_list_t* list =
            rd_kafka_topic_partition_list_new(static_cast<int>(ends_.size()));
        for (const PartitionEnd& end : ends_) {
            stored_[{end.topic, end.partition}] = end.next_offset;
            rd_kafka_topic_partition_list_add(list, end.topic.c_str(), end.partition)->offset =
                end.next_offset;
        }
        rd_kafka_commit(rk_, list, 1);  // async: only for external lag tools
        rd_kafka_topic_partition_list_destroy(list);
    }
    initial_.clear();
    free_messages();
}

void Consumer::free_messages() {
    for (rd_kafka_message_t* msg : messages_) rd_kafka_message_destroy(msg);
    messages_.clear();
}

}  // namespace eventbox::kafka
