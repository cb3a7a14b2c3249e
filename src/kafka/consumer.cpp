// One subscription's librdkafka consumer (see kafka/consumer.hpp).
#include "kafka/consumer.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace eventbox::kafka {

int partition_owner(const std::string& topic, int32_t partition, int members) {
    if (members <= 1) return 0;
    uint32_t h = 2166136261u;  // FNV-1a: stable across processes and releases
    for (unsigned char c : topic) h = (h ^ c) * 16777619u;
    uint64_t slot = static_cast<uint64_t>(h) + static_cast<uint32_t>(partition);
    return static_cast<int>(slot % static_cast<uint64_t>(members));
}

Consumer::Consumer(const ConsumerConfig& config)
    : topics_(config.topics),
      member_(config.member),
      members_(config.members < 1 ? 1 : config.members),
      start_latest_(config.start_latest),
      latest_since_ms_(config.latest_since_ms) {
    std::vector<KafkaOption> ours = {
        {"group.id", config.group_id},
        {"client.id", "pg_eventbox-ingest"},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", "earliest"},
        {"enable.partition.eof", "false"},
        // Bound what librdkafka prefetches for us (its default; with less, librdkafka 2.0 pauses
        // about 0.5 s each time the cap is hit and large messages stall).
        {"queued.max.messages.kbytes", "65536"},
        // A broker without data answers a fetch after at most this long; brokers that answer as
        // soon as data arrives (real Kafka) are unaffected, others then add at most this latency.
        {"fetch.wait.max.ms", "100"},
    };
    rd_kafka_conf_t* conf = new_conf(config.brokers, ours, config.options);

    char errstr[512];
    rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (rk_ == nullptr) {
        rd_kafka_conf_destroy(conf);
        throw Error(sqlstate::kConfigFileError, "could not create the Kafka consumer",
                    scrubber_.scrub(errstr));
    }
    // Logs and errors arrive on the consumer queue too, served by poll().
    rd_kafka_poll_set_consumer(rk_);
    queue_ = rd_kafka_queue_get_consumer(rk_);
    try {
        enable_queue_events(queue_);
    } catch (...) {
        rd_kafka_queue_destroy(queue_);
        rd_kafka_destroy(rk_);
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

bool Consumer::set_stored_offset(const std::string& topic, int32_t partition,
                                 int64_t next_offset) {
    if (!owns(topic, partition)) return false;
    auto [it, added] = stored_.try_emplace({topic, partition}, next_offset);
    if (!added && it->second == next_offset) return false;
    it->second = next_offset;
    return true;
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

bool Consumer::start_position(const char* topic, int32_t partition, int64_t* offset) {
    if (!start_latest_) {
        *offset = RD_KAFKA_OFFSET_BEGINNING;
        return true;
    }
    // 'latest' means: from when the subscription was created. The first message at or after that
    // time, else the current end; pinned and stored at once.
    int64_t found = offset_for_time(topic, partition, latest_since_ms_);
    if (found == -1) {
        int64_t low = -1, high = -1;
        rd_kafka_resp_err_t err =
            rd_kafka_query_watermark_offsets(rk_, topic, partition, &low, &high, 2000);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            found = -2;
        } else if (low < high && offset_for_time(topic, partition, 0) == -1) {
            // Every message has a timestamp >= 0, so the broker cannot look offsets up by time:
            // read the partition from its start once and skip the older messages.
            skip_before_[{topic, partition}] = latest_since_ms_;
            *offset = RD_KAFKA_OFFSET_BEGINNING;
            return true;
        } else {
            found = high;
        }
    }
    if (found < 0) {
        logs_.push_back(LogLine{4, std::string("could not resolve where ") + topic + "[" +
                                       std::to_string(partition) +
                                       "] starts for start_from 'latest'; retrying"});
        return false;
    }
    *offset = found;
    stored_[{topic, partition}] = found;
    initial_.push_back(PartitionEnd{topic, partition, found, -1, -1});
    return true;
}

int64_t Consumer::offset_for_time(const char* topic, int32_t partition, int64_t ms) {
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic, partition)->offset = ms;
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(rk_, list, 2000);
    int64_t found = err == RD_KAFKA_RESP_ERR_NO_ERROR && list->elems[0].err == 0
                        ? list->elems[0].offset
                        : -2;
    rd_kafka_topic_partition_list_destroy(list);
    return found;
}

void Consumer::refresh_assignment() {
    bool complete = true;
    rd_kafka_topic_partition_list_t* add = rd_kafka_topic_partition_list_new(8);
    for (const std::string& topic : topics_) {
        rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_, topic.c_str(), nullptr);
        const rd_kafka_metadata_t* md = nullptr;
        rd_kafka_resp_err_t err = rkt ? rd_kafka_metadata(rk_, 0, rkt, &md, 1000)
                                      : RD_KAFKA_RESP_ERR__INVALID_ARG;
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && md->topics[0].err == 0) {
            for (int i = 0; i < md->topics[0].partition_cnt; ++i) {
                int32_t partition = md->topics[0].partitions[i].id;
                if (assigned_.count({topic, partition}) != 0 || !owns(topic, partition)) continue;
                int64_t offset = stored_offset(topic, partition);
                if (offset < 0 && !start_position(topic.c_str(), partition, &offset)) {
                    complete = false;
                    continue;
                }
                rd_kafka_topic_partition_list_add(add, topic.c_str(), partition)->offset = offset;
                assigned_.insert({topic, partition});
            }
        } else {
            complete = false;
            rd_kafka_resp_err_t why = err != RD_KAFKA_RESP_ERR_NO_ERROR ? err
                                      : md && md->topic_cnt == 1 ? md->topics[0].err
                                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
            logs_.push_back(LogLine{4, "no partitions for topic " + topic + " yet: " +
                                           rd_kafka_err2str(why)});
        }
        if (md != nullptr) rd_kafka_metadata_destroy(md);
        if (rkt != nullptr) rd_kafka_topic_destroy(rkt);
    }
    if (add->cnt > 0) {
        rd_kafka_error_t* error = rd_kafka_incremental_assign(rk_, add);
        if (error != nullptr) {
            logs_.push_back(LogLine{4, std::string("could not assign partitions: ") +
                                           rd_kafka_error_string(error)});
            rd_kafka_error_destroy(error);
            for (int i = 0; i < add->cnt; ++i)
                assigned_.erase({add->elems[i].topic, add->elems[i].partition});
            complete = false;
        } else {
            logs_.push_back(LogLine{6, "assigned " + std::to_string(add->cnt) + " partition(s)"});
        }
    }
    rd_kafka_topic_partition_list_destroy(add);
    // Look for new partitions now and then; sooner while something is missing.
    next_refresh_ = std::chrono::steady_clock::now() +
                    (complete ? std::chrono::seconds(10) : std::chrono::seconds(1));
}

std::size_t Consumer::poll(std::size_t max) {
    drain_pipe();
    if (std::chrono::steady_clock::now() >= next_refresh_) refresh_assignment();
    while (messages_.size() < max) {
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
        auto skip = skip_before_.find({rd_kafka_topic_name(msg->rkt), msg->partition});
        if (skip != skip_before_.end()) {
            rd_kafka_timestamp_type_t type;
            int64_t ts = rd_kafka_message_timestamp(msg, &type);
            if (ts >= 0 && ts < skip->second) {
                skipped_[skip->first] = msg->offset + 1;
                rd_kafka_message_destroy(msg);
                continue;
            }
            skip_before_.erase(skip);  // from the first newer message on, take everything
        }
        messages_.push_back(msg);
    }
    return messages_.size();
}

const std::vector<PartitionEnd>& Consumer::partition_ends() {
    std::map<std::pair<std::string, int32_t>, int64_t> ends;
    for (const PartitionEnd& initial : initial_)
        ends[{initial.topic, initial.partition}] = initial.next_offset;
    for (const auto& [tp, next] : skipped_) ends[tp] = std::max(ends[tp], next);
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
    skipped_.clear();
    free_messages();
}

void Consumer::free_messages() {
    for (rd_kafka_message_t* msg : messages_) rd_kafka_message_destroy(msg);
    messages_.clear();
}

}  // namespace eventbox::kafka
