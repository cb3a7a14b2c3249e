// The ingest worker's consumer, shared by its subscriptions (see kafka/consumer.hpp): the
// subscriptions, their positions, polling and committing. Topics and the assignment are in
// kafka/consumer_topics.cpp.
#include "kafka/consumer.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kafka/consumer_internal.hpp"

namespace eventbox::kafka {

int partition_owner(const std::string& topic, int32_t partition, int members) {
    if (members <= 1) return 0;
    uint32_t h = 2166136261u;  // FNV-1a: stable across processes and releases
    for (unsigned char c : topic) h = (h ^ c) * 16777619u;
    uint64_t slot = static_cast<uint64_t>(h) + static_cast<uint32_t>(partition);
    return static_cast<int>(slot % static_cast<uint64_t>(members));
}

Consumer::Consumer(const ConsumerConfig& config)
    : member_(config.member),
      members_(config.members < 1 ? 1 : config.members),
      brokers_(config.brokers),
      options_(config.options),
      instance_base_(config.instance_base) {
    std::vector<KafkaOption> ours = {
        {"group.id", config.group_id},
        {"client.id", "pg_eventbox-ingest"},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", "earliest"},
        {"enable.partition.eof", "false"},
        // Bound what librdkafka prefetches for us (its default; with less, librdkafka 2.0 pauses
        // about 0.5 s each time the cap is hit and large messages stall). The cap is per
        // partition: it does not grow with the subscriptions reading one.
        {"queued.max.messages.kbytes", "65536"},
        // A broker without data answers a fetch after at most this long; brokers that answer as
        // soon as data arrives (real Kafka) are unaffected, others then add at most this latency.
        {"fetch.wait.max.ms", "100"},
    };
    rd_kafka_conf_t* conf = new_conf(config.brokers, ours, config.options);

    rk_ = new_handle(RD_KAFKA_CONSUMER, conf, "consumer");
    // Logs and errors arrive on the consumer queue too, served by poll().
    rd_kafka_poll_set_consumer(rk_);
    queue_ = rd_kafka_queue_get_consumer(rk_);
    admin_queue_ = rd_kafka_queue_new(rk_);
    try {
        enable_queue_events(queue_);
    } catch (...) {
        rd_kafka_queue_destroy(admin_queue_);
        rd_kafka_queue_destroy(queue_);
        rd_kafka_destroy(rk_);
        throw;
    }
}

Consumer::~Consumer() {
    release();
    subs_.clear();  // group members leave (committing what they owe) while the consumer exists
    rd_kafka_queue_destroy(admin_queue_);
    disable_queue_events(queue_);
    rd_kafka_queue_destroy(queue_);
    rd_kafka_consumer_close(rk_);
    rd_kafka_destroy(rk_);
    close_pipe();
}

Consumer::Sub& Consumer::sub(int id) {
    auto it = subs_.find(id);
    if (it == subs_.end()) throw Error(sqlstate::kInternalError, "unknown consumer subscription");
    return *it->second;
}

const Consumer::Sub& Consumer::sub(int id) const {
    auto it = subs_.find(id);
    if (it == subs_.end()) throw Error(sqlstate::kInternalError, "unknown consumer subscription");
    return *it->second;
}

int Consumer::add_subscription(const SubscriptionConfig& config) {
    auto s = std::make_unique<Sub>();
    s->config = config;
    if (config.group) {
        GroupMember::Config group;
        group.brokers = brokers_;
        group.options = options_;
        group.group_id = config.group_id;
        group.instance_id = group_instance_id(instance_base_, config.name);
        group.topics = config.topics;
        s->member = std::make_unique<GroupMember>(group);
    }
    int id = next_id_++;
    subs_.emplace(id, std::move(s));
    changed_ = true;
    return id;
}

void Consumer::remove_subscription(int id) {
    // Its records of the last poll stay in messages_ until release().
    subs_.erase(id);
    changed_ = true;
}

bool Consumer::set_stored_offset(int id, const std::string& topic, int32_t partition,
                                 int64_t next_offset, int64_t backfill_until) {
    Sub& s = sub(id);
    if (s.member == nullptr && !owns(topic, partition)) return false;
    Position& p = s.positions[{topic, partition}];
    if (backfill_until >= 0) p.backfill_until = backfill_until;
    if (p.stored == next_offset) return false;
    p.stored = next_offset;
    return true;
}

void Consumer::seek_to_stored(int id) {
    Sub& s = sub(id);
    for (auto& [tp, p] : s.positions) {
        if (p.stored < 0) continue;
        p.next = p.stored;
        p.skip_before_ms = -1;
        s.initial.erase(tp);
        s.skipped.erase(tp);
    }
    changed_ = true;
}

int64_t Consumer::backfill_until(int id, const std::string& topic, int32_t partition) const {
    const Sub& s = sub(id);
    auto it = s.positions.find({topic, partition});
    return it == s.positions.end() ? -1 : it->second.backfill_until;
}

int64_t Consumer::stored_offset(int id, const std::string& topic, int32_t partition) const {
    const Sub& s = sub(id);
    auto it = s.positions.find({topic, partition});
    return it == s.positions.end() ? -1 : it->second.stored;
}

void Consumer::pause(int id) {
    Sub& s = sub(id);
    s.paused = true;
    s.positions.clear();
    s.batch.clear();
    s.initial.clear();
    s.skipped.clear();
    s.start_problem.clear();
    s.commit_due = false;
    changed_ = true;
}

void Consumer::resume(int id) {
    Sub& s = sub(id);
    s.paused = false;
    // A group's partition starts at the later of its stored and committed offsets (maintain()).
    for (auto& [tp, p] : s.positions) p.next = s.member ? -1 : p.stored;
    changed_ = true;
}

bool Consumer::paused(int id) const {
    return sub(id).paused;
}

const std::vector<rd_kafka_message_t*>& Consumer::batch(int id) const noexcept {
    auto it = subs_.find(id);
    return it == subs_.end() ? empty_ : it->second->batch;
}

bool Consumer::has_positions_to_store(int id) const {
    const Sub& s = sub(id);
    return !s.paused && (!s.initial.empty() || !s.skipped.empty());
}

bool Consumer::reads(const Sub& s, const TopicPartition& tp) const {
    return s.member ? s.member->assigned().count(tp) > 0 : owns(tp.first, tp.second);
}

int64_t Consumer::group_uncommitted(int id) const {
    const Sub& s = sub(id);
    return s.member ? s.member->uncommitted() : 0;
}

int Consumer::group_partitions(int id) const {
    const Sub& s = sub(id);
    return s.member ? static_cast<int>(s.member->assigned().size()) : -1;
}

void Consumer::serve_groups() {
    for (auto& [id, sp] : subs_) {
        Sub& s = *sp;
        if (s.member == nullptr) continue;
        GroupMember& member = *s.member;
        member.serve(0);
        // Waits briefly for the last batch's commit (a round trip to the group coordinator).
        member.commit();
        for (int i = 0; i < kGroupCommitWaits && member.committing(); ++i)
            member.serve(kGroupCommitWaitMs);
        for (LogLine& line : member.logs()) logs_.push_back(std::move(line));
        member.logs().clear();
        if (member.changes() != s.member_changes) {
            // Partitions released stop here; those that came start in maintain().
            s.member_changes = member.changes();
            for (auto& [tp, p] : s.positions) {
                if (member.assigned().count(tp)) continue;
                p.next = -1;
                p.skip_before_ms = -1;
                s.initial.erase(tp);
                s.skipped.erase(tp);
            }
            changed_ = true;
        }
        bool held = member.uncommitted() > 0;
        if (held != s.held) {
            changed_ = true;
            logs_.push_back(
                LogLine{6, "subscription " + s.config.name +
                               (held ? " waits for its group to acknowledge " +
                                           std::to_string(member.uncommitted()) + " offsets"
                                     : " has its offsets acknowledged by its group")});
        }
        s.held = held;
    }
}

const std::string& Consumer::problem(int id) const noexcept {
    auto it = subs_.find(id);
    return it == subs_.end() ? no_problem_ : it->second->problem;
}

void Consumer::commit_offsets() {
    auto now = Clock::now();
    std::size_t sent = 0;
    for (auto& [id, sp] : subs_) {
        Sub& s = *sp;
        // A group's offsets are committed by its member (committed()).
        if (!s.commit_due || s.paused || s.member || now < s.next_commit) continue;
        if (sent++ >= kCommitsPerPoll) break;
        rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(4);
        for (const auto& [tp, p] : s.positions)
            if (p.stored >= 0)
                rd_kafka_topic_partition_list_add(list, tp.first.c_str(), tp.second)->offset =
                    p.stored;
        if (list->cnt > 0) {
            rd_kafka_AlterConsumerGroupOffsets_t* alter =
                rd_kafka_AlterConsumerGroupOffsets_new(s.config.group_id.c_str(), list);
            rd_kafka_AlterConsumerGroupOffsets(rk_, &alter, 1, nullptr, admin_queue_);
            rd_kafka_AlterConsumerGroupOffsets_destroy(alter);
        }
        rd_kafka_topic_partition_list_destroy(list);
        s.commit_due = false;
        s.next_commit = now + kCommitInterval;
    }
}

void Consumer::serve_admin_results() {
    while (rd_kafka_event_t* event = rd_kafka_queue_poll(admin_queue_, 0)) {
        if (rd_kafka_event_error(event) != RD_KAFKA_RESP_ERR_NO_ERROR)
            logs_.push_back(LogLine{6, std::string("committing offsets to Kafka failed: ") +
                                           rd_kafka_event_error_string(event)});
        rd_kafka_event_destroy(event);
    }
}

std::size_t Consumer::poll(std::size_t max) {
    drain_pipe();
    serve_admin_results();
    serve_groups();
    if (changed_ || Clock::now() >= next_maintain_) maintain();
    commit_offsets();
    std::size_t read = 0;
    while (read < max) {
        rd_kafka_message_t* msg = rd_kafka_consumer_poll(rk_, 0);
        if (msg != nullptr && deferred_) rd_kafka_message_destroy(msg);  // read again later
        rethrow_deferred();
        if (msg == nullptr) break;
        if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            std::string text = rd_kafka_message_errstr(msg);
            if (msg->rkt != nullptr) {
                TopicPartition tp{rd_kafka_topic_name(msg->rkt), msg->partition};
                auto topic = topics_.find(tp.first);
                // Offsets reset to the earliest are routine; a refused fetch is the topic's
                // problem until a record arrives.
                if (topic != topics_.end() && msg->err != RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET)
                    topic->second.fetch_error = "topic " + tp.first + ": " + text;
                text = where(tp) + ": " + text;
            }
            logs_.push_back(LogLine{4, "consumer error: " + text});
            rd_kafka_message_destroy(msg);
            continue;
        }
        ++read;
        if (msg->rkt != last_rkt_ || msg->partition != last_partition_) {
            auto it = partitions_.find({rd_kafka_topic_name(msg->rkt), msg->partition});
            last_ = it == partitions_.end() ? nullptr : &it->second;
            last_topic_ = it == partitions_.end() ? nullptr : &it->first.first;
            last_rkt_ = msg->rkt;
            last_partition_ = msg->partition;
            if (last_topic_ != nullptr) {
                Topic& topic = topics_[*last_topic_];
                if (!topic.fetch_error.empty()) {
                    topic.fetch_error.clear();
                    update_problems();
                }
            }
        }
        Partition* part = last_;
        if (part == nullptr) {  // no longer assigned
            rd_kafka_message_destroy(msg);
            continue;
        }
        part->fetch_next = msg->offset + 1;
        bool kept = false;
        for (Reader& r : part->readers) {
            Position& p = *r.position;
            if (msg->offset < p.next) continue;  // this subscription has it already
            p.next = msg->offset + 1;
            if (p.skip_before_ms >= 0) {
                rd_kafka_timestamp_type_t type;
                int64_t ts = rd_kafka_message_timestamp(msg, &type);
                if (ts >= 0 && ts < p.skip_before_ms) {
                    r.sub->skipped[*r.tp] = msg->offset + 1;
                    continue;
                }
                p.skip_before_ms = -1;  // from the first newer message on, take everything
            }
            r.sub->batch.push_back(msg);
            kept = true;
        }
        if (kept)
            messages_.push_back(msg);
        else
            rd_kafka_message_destroy(msg);
    }
    return read;
}

const std::vector<PartitionEnd>& Consumer::partition_ends(int id, std::size_t from,
                                                          std::size_t to) {
    Sub& s = sub(id);
    std::map<TopicPartition, int64_t> ends(s.initial.begin(), s.initial.end());
    for (const auto& [tp, next] : s.skipped) ends[tp] = std::max(ends[tp], next);
    to = std::min(to, s.batch.size());
    for (std::size_t i = from; i < to; ++i) {
        rd_kafka_message_t* msg = s.batch[i];
        int64_t& next = ends[{rd_kafka_topic_name(msg->rkt), msg->partition}];
        next = std::max(next, msg->offset + 1);
    }
    s.ends.clear();
    for (auto& [tp, next] : ends) {
        int64_t low = -1, high = -1;
        rd_kafka_get_watermark_offsets(rk_, tp.first.c_str(), tp.second, &low, &high);
        auto p = s.positions.find(tp);
        int64_t previous = p == s.positions.end() ? -1 : p->second.stored;
        // A pinned initial position is not stored yet: there is nothing to compare with.
        if (s.initial.count(tp)) previous = -1;
        int64_t until = p == s.positions.end() ? -1 : p->second.backfill_until;
        s.ends.push_back(PartitionEnd{tp.first, tp.second, next, high, previous, until});
    }
    return s.ends;
}

void Consumer::committed(int id) {
    Sub& s = sub(id);
    for (const PartitionEnd& end : s.ends) {
        auto p = s.positions.find({end.topic, end.partition});
        if (p != s.positions.end()) p->second.stored = end.next_offset;
        if (s.member) s.member->stored(end.topic, end.partition, end.next_offset);
    }
    // Right after the database commit; its acknowledgement is awaited by serve_groups().
    if (s.member) s.member->commit();
    if (!s.ends.empty()) s.commit_due = true;
    s.ends.clear();
    s.initial.clear();
    s.skipped.clear();
}

void Consumer::release() noexcept {
    for (rd_kafka_message_t* msg : messages_) rd_kafka_message_destroy(msg);
    messages_.clear();
    for (auto& [id, s] : subs_) s->batch.clear();
}

}  // namespace eventbox::kafka
