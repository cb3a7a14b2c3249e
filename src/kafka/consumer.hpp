// One subscription's librdkafka consumer in one ingest worker. The database is the source of
// truth for offsets. Partitions are assigned directly (no consumer group membership, so a
// restart resumes at once instead of waiting out a session timeout), each to one of the ingest
// workers by partition_owner(), at the offset stored in eventbox.offsets (kept in an in-memory
// copy, since its owner is its only writer), else at the subscription's start position. The
// group id is still used to commit offsets to Kafka, asynchronously after the database commit,
// only so that external lag tools see progress. Pure C++.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kafka/client.hpp"

namespace eventbox::kafka {

// Which of `members` ingest workers consumes a partition: a topic's partitions are dealt out
// round robin, from a starting worker that depends on the topic, so that every worker gets its
// share of each topic and of many small ones.
int partition_owner(const std::string& topic, int32_t partition, int members);

struct ConsumerConfig {
    std::string brokers;
    int member = 0;   // this ingest worker's index
    int members = 1;  // how many ingest workers share the partitions
    std::vector<KafkaOption> options;  // user options, applied after our defaults
    std::string group_id;
    std::vector<std::string> topics;
    bool start_latest = false;  // no stored offset: start at `latest_since_ms`, not the beginning
    int64_t latest_since_ms = 0;  // when the subscription was created (Unix epoch ms)
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

    // The next offset to read for a partition, as stored in the database; ignored for a
    // partition another ingest worker owns. Returns whether this consumer's copy changed.
    bool set_stored_offset(const std::string& topic, int32_t partition, int64_t next_offset);
    // Moves every assigned partition to its stored offset (after set_stored_offset() learned that
    // the table changed, e.g. eventbox.replay). Prefetched messages from before are dropped.
    void seek_to_stored();
    // What this consumer believes is stored for a partition; -1 when nothing.
    int64_t stored_offset(const std::string& topic, int32_t partition) const;

    // Reads up to `max` messages without blocking (assigning new partitions, serving logs and
    // errors on the way); returns how many are now in messages(). They stay valid until
    // committed().
    std::size_t poll(std::size_t max);
    const std::vector<rd_kafka_message_t*>& messages() const { return messages_; }
    // The next offset of every partition in messages(), to store with the batch.
    const std::vector<PartitionEnd>& partition_ends();
    // The batch is in the database: remember its offsets, commit them to Kafka asynchronously
    // and free the messages.
    void committed();

    std::size_t assigned_partitions() const { return assigned_.size(); }
    // Whether this worker consumes the partition (see partition_owner()).
    bool owns(const std::string& topic, int32_t partition) const {
        return partition_owner(topic, partition, members_) == member_;
    }

    // Whether the next batch must store offsets even without messages: partitions started at a
    // position resolved from start_from 'latest' (stored at once, so a restart starts there
    // too), or older messages skipped for it. Cleared by committed().
    bool has_positions_to_store() const { return !initial_.empty() || !skipped_.empty(); }

private:
    // Assigns the subscribed topics' partitions that are not assigned yet (new topics, added
    // partitions), from fresh metadata. Called by poll() now and then.
    void refresh_assignment();
    // The first offset at or after time `ms` (Unix epoch), -1 when there is none, -2 on error.
    int64_t offset_for_time(const char* topic, int32_t partition, int64_t ms);
    // Where a partition with nothing stored starts; false when it cannot be resolved now.
    bool start_position(const char* topic, int32_t partition, int64_t* offset);
    void free_messages();

    rd_kafka_t* rk_ = nullptr;
    rd_kafka_queue_t* queue_ = nullptr;
    std::vector<std::string> topics_;
    int member_ = 0;
    int members_ = 1;
    bool start_latest_ = false;
    int64_t latest_since_ms_ = 0;
    std::chrono::steady_clock::time_point next_refresh_{};
    std::set<std::pair<std::string, int32_t>> assigned_;
    std::map<std::pair<std::string, int32_t>, int64_t> stored_;
    std::vector<rd_kafka_message_t*> messages_;
    std::vector<PartitionEnd> ends_;
    std::vector<PartitionEnd> initial_;
    // start_from 'latest' on a broker that cannot look offsets up by time (the dev broker):
    // such partitions are read from their start once, skipping messages older than this.
    std::map<std::pair<std::string, int32_t>, int64_t> skip_before_;
    std::map<std::pair<std::string, int32_t>, int64_t> skipped_;  // next offset after skips
};

}  // namespace eventbox::kafka
