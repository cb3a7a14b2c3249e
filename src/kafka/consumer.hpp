// The one librdkafka consumer of an ingest worker, serving all of its subscriptions. The
// database is the source of truth for offsets. Partitions are assigned directly (no consumer
// group membership, so a restart resumes at once instead of waiting out a session timeout),
// each to one of the ingest workers by partition_owner(). A partition is assigned once, however
// many subscriptions read it, and fetched from the lowest position any of them needs; each
// record goes to every subscription whose own position (its offset stored in eventbox.offsets,
// kept in an in-memory copy since its owner is its only writer, else its start position) it
// has reached. So threads, sockets and fds do not grow with the number of subscriptions.
//
// A subscription that cannot read (a topic the broker does not know or refuses, a start
// position that cannot be resolved) has its problem() set and is retried on its own with a
// backoff; the others go on. A subscription the caller pauses (its batch could not be stored)
// gets nothing until resume(), which starts it again from its stored offsets.
//
// The subscriptions' offsets are committed to Kafka under their own group ids, at most every few
// seconds and asynchronously, only so that external lag tools see progress. Pure C++.
//
// A subscription with membership 'group' reads instead the partitions its Kafka consumer group
// gives this worker (kafka/group_member.hpp): each starts at the later of its stored offset and
// the group's committed one, and each batch's offsets are committed to the group after the
// database commit. While the group has not acknowledged the last batch's offsets the
// subscription is held (not read), so that what a move can hand to two servers stays within one
// batch (docs/guide/scaling.md).
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kafka/client.hpp"
#include "kafka/group_member.hpp"

namespace eventbox::kafka {

// Which of `members` ingest workers consumes a partition: a topic's partitions are dealt out
// round robin, from a starting worker that depends on the topic, so that every worker gets its
// share of each topic and of many small ones.
int partition_owner(const std::string& topic, int32_t partition, int members);

struct ConsumerConfig {
    std::string brokers;
    int member = 0;                    // this ingest worker's index
    int members = 1;                   // how many ingest workers share the partitions
    std::vector<KafkaOption> options;  // user options, applied after our defaults
    std::string group_id;              // the handle's own group id (nothing is committed there)
    // A stable identity of this server, database and worker: the base of the group.instance.id
    // of its subscriptions with membership 'group'.
    std::string instance_base;
};

struct SubscriptionConfig {
    std::string name;
    std::string group_id;  // where its offsets are committed for external lag tools
    std::vector<std::string> topics;
    bool start_latest = false;    // no stored offset: start at `latest_since_ms`, not the beginning
    int64_t latest_since_ms = 0;  // when the subscription was created (Unix epoch ms)
    // backfill => true: a partition with nothing stored starts at the beginning, and the offset
    // where it stood when the subscription was created (as for start_from 'latest') is kept as
    // its backfill boundary (backfill_until()).
    bool backfill = false;
    bool group = false;  // membership 'group': the partitions its consumer group gives us
};

struct PartitionEnd {
    std::string topic;
    int32_t partition;
    int64_t next_offset;
    int64_t high_watermark;  // as last seen in a fetch response; -1 when unknown
    int64_t previous;        // the stored offset the subscription continued from; -1 when none
    int64_t backfill_until;  // the partition's backfill boundary; -1 when none
};

using TopicPartition = std::pair<std::string, int32_t>;

class Consumer final : public ClientEvents {
  public:
    // Throws eventbox::Error when a configuration property is rejected (naming the key only).
    explicit Consumer(const ConsumerConfig& config);
    ~Consumer();
    Consumer(const Consumer&) = delete;
    Consumer& operator=(const Consumer&) = delete;

    int event_fd() const noexcept { return pipe_[0]; }

    // Adds a subscription, paused: give it its stored offsets, then resume(). Returns its id.
    int add_subscription(const SubscriptionConfig& config);
    void remove_subscription(int id);

    // The next offset to read for a partition, as stored in the database; ignored for a
    // partition another ingest worker owns. Returns whether the subscription's copy changed.
    bool set_stored_offset(int id, const std::string& topic, int32_t partition, int64_t next_offset,
                           int64_t backfill_until = -1);
    // A backfill subscription's boundary in a partition: its records below that offset were in
    // the partition when the subscription was created. -1 when it has none.
    int64_t backfill_until(int id, const std::string& topic, int32_t partition) const;
    // Moves the subscription to its stored offsets (after set_stored_offset() learned that the
    // table changed, e.g. eventbox.replay); the partitions are fetched again from there if needed.
    void seek_to_stored(int id);
    // What the subscription believes is stored for a partition; -1 when nothing.
    int64_t stored_offset(int id, const std::string& topic, int32_t partition) const;

    // Stops delivering to the subscription and forgets its positions, stored offsets included,
    // and its batch (its last batch could not be stored). Give it its stored offsets again, then
    // resume() starts it from them.
    void pause(int id);
    void resume(int id);
    bool paused(int id) const;

    // Reads up to `max` records without blocking (assigning partitions, serving logs and errors
    // on the way) and hands each to the subscriptions that want it; returns how many records
    // were read. They stay valid until release().
    std::size_t poll(std::size_t max);
    // The records of the last poll() for a subscription, in the order read.
    const std::vector<rd_kafka_message_t*>& batch(int id) const noexcept;
    // Whether the subscription must store offsets even without records: partitions started at a
    // position resolved from start_from 'latest' (stored at once, so a restart starts there
    // too), or older records skipped for it. Cleared by committed().
    bool has_positions_to_store(int id) const;
    // The next offset of every partition in batch(id)[from, to) (and the positions to store),
    // to store with those records.
    const std::vector<PartitionEnd>& partition_ends(int id, std::size_t from, std::size_t to);
    // Those records are in the database: remember their offsets (committed to Kafka later).
    void committed(int id);
    // Frees the records of the last poll().
    void release() noexcept;

    // Membership 'group': offsets stored and not yet acknowledged by the group (0 otherwise).
    int64_t group_uncommitted(int id) const;
    // Membership 'group': the partitions the group gives this worker (-1 otherwise).
    int group_partitions(int id) const;

    // Why the subscription cannot read (some of) its partitions; empty when it can.
    const std::string& problem(int id) const noexcept;

    std::size_t assigned_partitions() const noexcept { return partitions_.size(); }
    // Metadata requests made so far (one per refresh, whatever the number of topics).
    std::size_t metadata_requests() const noexcept { return metadata_requests_; }
    std::size_t subscriptions() const { return subs_.size(); }
    // Whether this worker consumes the partition (see partition_owner()).
    bool owns(const std::string& topic, int32_t partition) const {
        return partition_owner(topic, partition, members_) == member_;
    }

  private:
    struct Position {
        int64_t next = -1;            // next offset to hand over; -1 while unresolved
        int64_t stored = -1;          // as stored in the database; -1 when nothing is
        int64_t skip_before_ms = -1;  // start_from 'latest' without time lookups: see poll()
        int64_t backfill_until = -1;  // see SubscriptionConfig::backfill
    };
    struct Sub {
        SubscriptionConfig config;
        bool paused = true;
        std::map<TopicPartition, Position> positions;
        std::vector<rd_kafka_message_t*> batch;
        std::map<TopicPartition, int64_t> initial;  // resolved start positions not yet stored
        std::map<TopicPartition, int64_t> skipped;  // next offset after skipped older records
        std::vector<PartitionEnd> ends;
        std::string start_problem;  // start positions that could not be resolved
        int start_backoff_ms = 0;
        std::chrono::steady_clock::time_point next_start_try{};
        std::string problem;
        bool commit_due = false;
        std::chrono::steady_clock::time_point next_commit{};
        std::unique_ptr<GroupMember> member;  // membership 'group'
        uint64_t member_changes = 0;          // member->changes() when last followed
        bool held = false;  // its last batch's offsets are not acknowledged by the group yet
    };
    struct Reader {
        Sub* sub;
        Position* position;
        const TopicPartition* tp;
    };
    struct Partition {
        int64_t fetch_next = -1;  // the offset librdkafka fetches next, as far as we know
        bool paused = false;
        std::vector<Reader> readers;  // subscriptions that are not paused and have a position
    };
    struct Topic {
        std::vector<int32_t> partitions;  // ids this worker owns
        bool known = false;
        std::string error;        // why its metadata could not be read; empty when it was
        std::string fetch_error;  // last fetch error, until a record arrives
        int backoff_ms = 0;
        std::chrono::steady_clock::time_point next_refresh{};
    };

    Sub& sub(int id);
    const Sub& sub(int id) const;
    // Whether the subscription reads the partition: for membership 'group', one its group gives
    // this worker; else one this worker owns (partition_owner()).
    bool reads(const Sub& s, const TopicPartition& tp) const;
    // Serves the subscriptions' group members: follows their assignments, commits what the
    // database stored and holds those whose last commit is not acknowledged.
    void serve_groups();
    // Refreshes the metadata of the topics that are due (all every 10 s, failing ones with a
    // growing backoff), resolves missing start positions and brings the assignment, the readers
    // and the fetch positions in line.
    void maintain();
    // Reads the metadata of the `due` topics in one request and records what it found.
    void refresh_topics(const std::vector<std::string>& due);
    void topic_found(const std::string& name, const rd_kafka_metadata_topic_t& md);
    void topic_missing(const std::string& name, rd_kafka_resp_err_t why);
    // Positions of the partitions the group gave a 'group' subscription that it does not read
    // yet; false when a start could not be resolved.
    bool place_group_positions(Sub& s, bool may_try);
    // Where a partition with nothing stored starts; false when it cannot be resolved now.
    bool start_position(Sub& s, const std::string& topic, int32_t partition, Position* position);
    // The first offset at or after time `ms` (Unix epoch), -1 when there is none, -2 on error.
    int64_t offset_for_time(const char* topic, int32_t partition, int64_t ms);
    // The partition lists one update_assignment() hands to librdkafka; freed with the object.
    struct Changes {
        rd_kafka_topic_partition_list_t* add = rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t* pause = rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t* resume = rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t* seek = rd_kafka_topic_partition_list_new(4);
        Changes() = default;
        Changes(Changes&& o) noexcept : add(o.add), pause(o.pause), resume(o.resume), seek(o.seek) {
            o.add = o.pause = o.resume = o.seek = nullptr;
        }
        Changes(const Changes&) = delete;
        Changes& operator=(const Changes&) = delete;
        ~Changes() {
            for (auto* list : {add, pause, resume, seek})
                if (list != nullptr) rd_kafka_topic_partition_list_destroy(list);
        }
    };
    // Brings the assignment, the readers and the fetch positions in line with the topics and
    // subscriptions, in named steps.
    void update_assignment();
    void unassign_unwanted(const std::set<TopicPartition>& wanted);
    Changes place_readers(const std::set<TopicPartition>& wanted);
    void apply(Changes& changes);
    void seek(rd_kafka_topic_partition_list_t* seek);
    void update_problems();
    void commit_offsets();
    void serve_admin_results();

    rd_kafka_t* rk_ = nullptr;
    rd_kafka_queue_t* queue_ = nullptr;
    rd_kafka_queue_t* admin_queue_ = nullptr;
    int member_ = 0;
    int members_ = 1;
    std::string brokers_;
    std::vector<KafkaOption> options_;
    std::string instance_base_;
    int next_id_ = 1;
    bool changed_ = true;         // subscriptions or positions changed: maintain() at the next poll
    int missing_in_refresh_ = 0;  // topics the current refresh found without partitions
    std::size_t metadata_requests_ = 0;
    std::chrono::steady_clock::time_point next_maintain_{};
    std::map<int, std::unique_ptr<Sub>> subs_;
    std::map<std::string, Topic> topics_;
    std::map<TopicPartition, Partition> partitions_;  // assigned
    std::vector<rd_kafka_message_t*> messages_;       // read by the last poll()
    // The partition of the last record read: records come in runs of one partition.
    rd_kafka_topic_t* last_rkt_ = nullptr;
    int32_t last_partition_ = -1;
    Partition* last_ = nullptr;
    const std::string* last_topic_ = nullptr;
    std::string lookup_error_;  // why the last offset lookup failed
    std::vector<rd_kafka_message_t*> empty_;
    std::string no_problem_;
};

}  // namespace eventbox::kafka
