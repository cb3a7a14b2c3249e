// One subscription's librdkafka high-level consumer. The database is the source of truth for
// offsets: on assignment each partition starts at the offset stored in eventbox.offsets (kept in
// an in-memory copy, since the ingest worker is its only writer), falling back to the
// subscription's start position. Kafka offsets are committed asynchronously after the database
// commit, only so that external lag tools see progress. Pure C++.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kafka_client.hpp"

namespace eventbox::kafka {

struct ConsumerConfig {
    std::string brokers;
    std::vector<KafkaOption> options;  // user options, applied after our defaults
    std::string group_id;
    std::vector<std::string> topics;
    bool start_latest = false;  // no stored offset: start at the end instead of the beginning
};

struct PartitionEnd {
    std::string topic;
    int32_t partition;
    int64_t next_offset;
    int64_t high_watermark;  // as last seen in a fetch response; -1 when unknown
    int64_t previous;        // the stored offset this consumer started from; -1 when none
};

class Consumer final : public ClientEvents {
public:
    // Throws eventbox::Error when a configuration property is rejected (naming the key only).
    explicit Consumer(const ConsumerConfig& config);
    ~Consumer();
    Consumer(const Consumer&) = delete;
    Consumer& operator=(const Consumer&) = delete;

    int event_fd() const { return pipe_[0]; }

    // The next offset to read for a partition, as stored in the database.
    void set_stored_offset(const std::string& topic, int32_t partition, int64_t next_offset);
    // Moves every assigned partition to its stored offset (after set_stored_offset() learned that
    // the table changed, e.g. eventbox.replay). Prefetched messages from before are dropped.
    void seek_to_stored();
    // What this consumer believes is stored for a partition; -1 when nothing.
    int64_t stored_offset(const std::string& topic, int32_t partition) const;

    // Reads up to `max` messages without blocking (serving rebalances, logs and errors on the
    // way); returns how many are now in messages(). They stay valid until committed().
    std::size_t poll(std::size_t max);
    const std::vector<rd_kafka_message_t*>& messages() const { return messages_; }
    // The next offset of every partition in messages(), to store with the batch.
    const std::vector<PartitionEnd>& partition_ends();
    // The batch is in the database: remember its offsets, commit them to Kafka asynchronously
    // and free the messages.
    void committed();

    std::size_t assigned_partitions() const { return assigned_; }

    // Partitions first assigned at the end (start_from latest, nothing stored yet), with the
    // concrete offset they start at: stored at once, so a restart does not skip what arrives
    // meanwhile. Cleared by committed().
    const std::vector<PartitionEnd>& initial_positions() const { return initial_; }

private:
    static void on_rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t* partitions, void* opaque);
    void free_messages();

    rd_kafka_t* rk_ = nullptr;
    rd_kafka_queue_t* queue_ = nullptr;
    bool start_latest_ = false;
    bool revoked_ = false;  // a revocation happened during poll(): stop this batch there
    std::size_t assigned_ = 0;
    std::map<std::pair<std::string, int32_t>, int64_t> stored_;
    std::vector<rd_kafka_message_t*> messages_;
    std::vector<PartitionEnd> ends_;
    std::vector<PartitionEnd> initial_;
};

}  // namespace eventbox::kafka
