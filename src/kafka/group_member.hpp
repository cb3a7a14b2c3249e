// A subscription's seat in its Kafka consumer group (membership 'group'): a librdkafka handle
// that joins the group named by the subscription's group_id (cooperative-sticky assignment,
// static membership through group.instance.id) and holds the partitions the group gives it,
// paused: the records are read by the worker's one consumer (kafka/consumer.hpp), which reads
// for the subscription only the partitions this member holds. The member also carries the
// offsets the database stored to the group, so that the next owner of a partition starts where
// this server stopped. See docs/guide/scaling.md ("Group membership").
//
// Its callbacks (rebalances, commit results, logs) are served by serve(), on the caller's
// thread: they touch this object only. Pure C++.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kafka/client.hpp"

namespace eventbox::kafka {

// The group settings ours, chosen so that a stopped server's partitions move within 30 s (see
// docs/guide/scaling.md): its session ends 10 s after its last heartbeat, heartbeats every
// second, and a worker stuck 30 s in one turn (not serving the group) leaves it.
inline constexpr const char* kGroupSessionTimeoutMs = "10000";
inline constexpr const char* kGroupHeartbeatMs = "1000";
inline constexpr const char* kGroupMaxPollIntervalMs = "30000";

// The group.instance.id of a subscription's member: `base` (a stable identity of the server,
// database and ingest worker) and the subscription's name, with characters Kafka does not
// accept in the id replaced by '_', at most 249 characters.
std::string group_instance_id(const std::string& base, const std::string& subscription);

class GroupMember final : public ClientEvents {
  public:
    struct Config {
        std::string brokers;
        std::vector<KafkaOption> options;  // user options, applied after our defaults
        std::string group_id;
        std::string instance_id;  // group.instance.id
        std::vector<std::string> topics;
    };
    // Joins the group (asynchronously). Throws eventbox::Error when a property is rejected.
    explicit GroupMember(const Config& config);
    // Leaves the group: offsets stored and not acknowledged are committed (synchronously) first.
    ~GroupMember();
    GroupMember(const GroupMember&) = delete;
    GroupMember& operator=(const GroupMember&) = delete;

    // Serves the group's callbacks, waiting up to wait_ms for events (0: only what is there).
    void serve(int wait_ms);
    // The partitions the group gives this member, each with the offset the group had committed
    // for it when it came (-1: none).
    const std::map<std::pair<std::string, int32_t>, int64_t>& assigned() const noexcept {
        return assigned_;
    }
    // Counts assignments and revocations: it changes when assigned() does.
    uint64_t changes() const noexcept { return changes_; }
    // The worker starts reading a held partition at `next`: with no offset committed by the
    // group, nothing before it is owed.
    void started(const std::string& topic, int32_t partition, int64_t next);
    // The database stored `next` as the partition's next offset (committed): owed to the group.
    void stored(const std::string& topic, int32_t partition, int64_t next);
    // Sends the owed offsets of the held partitions to the group (asynchronously), unless a
    // commit is in flight.
    void commit();
    // Whether a commit is in flight (its result not served yet).
    bool committing() const noexcept { return in_flight_; }
    // Offsets stored in the database and not yet acknowledged by the group, summed over the held
    // partitions: what another server could handle again if this one stopped now.
    int64_t uncommitted() const noexcept;
    // Commits the group acknowledged (tests and the docs' figures).
    uint64_t commits_acknowledged() const noexcept { return acknowledged_; }
    // Whether the group chose this member's assignor and its first assignment has not come yet
    // (the member must not be destroyed now: see ~GroupMember()).
    bool awaiting_first_assignment() const { return !assigned_once_ && assignor_chosen(); }
    // Members of this process closed but left undestroyed by their destructor, because their
    // first assignment never came: their threads and sockets stay until the process ends.
    static uint64_t abandoned() noexcept;

  private:
    using TopicPartition = std::pair<std::string, int32_t>;
    static void on_rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t* partitions, void* opaque);
    static void on_commit(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                          rd_kafka_topic_partition_list_t* offsets, void* opaque);
    bool assignor_chosen() const;
    // Whether the group's rebalance protocol is COOPERATIVE (else EAGER), as last known.
    bool cooperative();
    // Commits the owed offsets of the held partitions in `among` (all when null) and waits for
    // the result (commit_now()); a refusal is logged.
    void commit_owed_now(const rd_kafka_topic_partition_list_t* among);
    void assign(rd_kafka_topic_partition_list_t* partitions);
    void revoke(rd_kafka_topic_partition_list_t* partitions, bool lost);
    // The owed offsets of the partitions in `among` (all held ones when null), as a list.
    rd_kafka_topic_partition_list_t* owed(const rd_kafka_topic_partition_list_t* among) const;
    void acknowledge(const rd_kafka_topic_partition_list_t* offsets);
    // Commits `offsets` and waits for the result, a few seconds at most.
    rd_kafka_resp_err_t commit_now(rd_kafka_topic_partition_list_t* offsets);

    rd_kafka_t* rk_ = nullptr;
    std::map<TopicPartition, int64_t> assigned_;  // held, with the group's offset at assignment
    std::map<TopicPartition, int64_t> stored_;    // stored in the database (next offsets)
    std::map<TopicPartition, int64_t> acked_;     // acknowledged by the group
    uint64_t changes_ = 0;
    uint64_t acknowledged_ = 0;
    bool in_flight_ = false;
    bool assigned_once_ = false;  // an assignment was served (the assignor's state exists)
    bool cooperative_ = true;     // the protocol last seen (ours is cooperative-sticky)
    std::chrono::steady_clock::time_point retry_at_{};  // after a refused commit
};

}  // namespace eventbox::kafka
