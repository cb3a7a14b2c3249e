// A subscription's seat in its Kafka consumer group (see kafka/group_member.hpp).
#include "kafka/group_member.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>

#include "core/error.hpp"

namespace eventbox::kafka {

namespace {

// How long the assignment waits for the group's committed offsets, and a revocation or the
// close for the commit of what is owed (the worker's loop waits meanwhile).
constexpr int kCommittedTimeoutMs = 5000;
// Events served per serve() call: bounded, the rest wait for the next turn.
constexpr int kEventsPerServe = 100;
// A commit the group refused (it rebalances) is sent again after this long.
constexpr auto kCommitRetry = std::chrono::milliseconds(500);
// How long a member about to be destroyed waits for the assignment its group promised.
constexpr auto kFirstAssignmentWait = std::chrono::milliseconds(5000);

std::atomic<uint64_t> abandoned_handles{0};

GroupMember* member_of(void* opaque) {
    return static_cast<GroupMember*>(static_cast<ClientEvents*>(opaque));
}

}  // namespace

std::string group_instance_id(const std::string& base, const std::string& subscription) {
    std::string id = "pg_eventbox." + base + "." + subscription;
    for (char& c : id)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
            c = '_';
    if (id.size() > 249) id.resize(249);
    return id;
}

GroupMember::GroupMember(const Config& config) {
    std::vector<KafkaOption> ours = {
        {"group.id", config.group_id},
        {"group.instance.id", config.instance_id},
        {"client.id", "pg_eventbox-group"},
        {"partition.assignment.strategy", "cooperative-sticky"},
        {"session.timeout.ms", kGroupSessionTimeoutMs},
        {"heartbeat.interval.ms", kGroupHeartbeatMs},
        {"max.poll.interval.ms", kGroupMaxPollIntervalMs},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"enable.partition.eof", "false"},
        // Its partitions are paused as soon as they come: what it fetches before is dropped.
        {"queued.max.messages.kbytes", "1024"},
    };
    rd_kafka_conf_t* conf = new_conf(config.brokers, ours, config.options);
    rd_kafka_conf_set_rebalance_cb(conf, &GroupMember::on_rebalance);
    rd_kafka_conf_set_offset_commit_cb(conf, &GroupMember::on_commit);
    rk_ = new_handle(RD_KAFKA_CONSUMER, conf, "group member");
    rd_kafka_poll_set_consumer(rk_);
    rd_kafka_topic_partition_list_t* topics =
        rd_kafka_topic_partition_list_new(static_cast<int>(config.topics.size()));
    for (const std::string& topic : config.topics)
        rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(rk_, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_destroy(rk_);
        throw Error(sqlstate::kConfigFileError, "could not join the Kafka consumer group",
                    rd_kafka_err2str(err));
    }
}

GroupMember::~GroupMember() {
    // librdkafka 2.0.2 aborts the process (an assertion in rd_kafka_cgrp_destroy_final(),
    // confluentinc/librdkafka#4312, fixed in 2.2.0) when a handle is destroyed after the group
    // chose the cooperative-sticky assignor (a JoinGroup answered) and before the member's first
    // assignment (the SyncGroup's answer, which creates the assignor's state). Its first
    // assignment is waited for, a few seconds at most; a handle still without one is closed and
    // left, not destroyed (abandoned(): the worker restarts to let it go).
    auto deadline = std::chrono::steady_clock::now() + kFirstAssignmentWait;
    bool chosen = assignor_chosen();
    while (!assigned_once_ && chosen && std::chrono::steady_clock::now() < deadline) {
        rd_kafka_message_t* msg = rd_kafka_consumer_poll(rk_, 100);
        if (msg != nullptr) rd_kafka_message_destroy(msg);
        chosen = assignor_chosen();
    }
    // What is owed is committed while the group still answers (a revocation the close serves may
    // come after its sub-system ended: its commit would wait in vain). The close revokes the
    // partitions through on_rebalance(); a static member does not leave the group: its
    // partitions wait a session timeout for it.
    try {
        commit_owed_now(nullptr);
    } catch (...) {  // no memory for the list: the revocation commits them
    }
    // Answers to the group's requests that come once it began are dropped, so the group's answer
    // read before it decides (it cannot be asked after); one handled between that question and
    // the close's start is a window of microseconds this does not close.
    rd_kafka_consumer_close(rk_);
    if (!assigned_once_ && chosen) {
        abandoned_handles.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    rd_kafka_destroy(rk_);
}

bool GroupMember::assignor_chosen() const {
    // "NONE" until a JoinGroup answer chose one; null when the group cannot say: then it may
    // have been chosen.
    const char* protocol = rd_kafka_rebalance_protocol(rk_);
    return protocol == nullptr || std::strcmp(protocol, "NONE") != 0;
}

bool GroupMember::cooperative() {
    // Null once the group's sub-system ended (a revocation the close serves can come after
    // that): the protocol last seen holds.
    const char* protocol = rd_kafka_rebalance_protocol(rk_);
    if (protocol != nullptr && std::strcmp(protocol, "NONE") != 0)
        cooperative_ = std::strcmp(protocol, "COOPERATIVE") == 0;
    return cooperative_;
}

uint64_t GroupMember::abandoned() noexcept {
    return abandoned_handles.load(std::memory_order_relaxed);
}

void GroupMember::serve(int wait_ms) {
    for (int i = 0; i < kEventsPerServe; ++i) {
        rd_kafka_message_t* msg = rd_kafka_consumer_poll(rk_, i == 0 ? wait_ms : 0);
        if (msg != nullptr && deferred_) rd_kafka_message_destroy(msg);
        rethrow_deferred();
        if (msg == nullptr) return;
        if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR)
            logs_.push_back(LogLine{6, std::string("consumer group: ") +
                                           scrubber_.scrub(rd_kafka_message_errstr(msg))});
        // Records fetched before their partition was paused: the worker's consumer reads them.
        rd_kafka_message_destroy(msg);
    }
}

void GroupMember::on_rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                               rd_kafka_topic_partition_list_t* partitions, void* opaque) {
    GroupMember* self = member_of(opaque);
    // An assignment or revocation cut short (no memory) ends the worker's run: the rethrown
    // error closes this member, and the group moves its partitions.
    self->in_callback([&] {
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
            self->assigned_once_ = true;
            self->assign(partitions);
        } else {
            if (err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS)
                self->logs_.push_back(LogLine{
                    4, std::string("consumer group rebalance failed: ") + rd_kafka_err2str(err)});
            self->revoke(partitions, rd_kafka_assignment_lost(rk) != 0);
        }
    });
}

void GroupMember::assign(rd_kafka_topic_partition_list_t* partitions) {
    // Where the group stands in each partition: the worker starts at the later of that and
    // what this server stored.
    rd_kafka_topic_partition_list_t* committed = rd_kafka_topic_partition_list_copy(partitions);
    rd_kafka_resp_err_t err = rd_kafka_committed(rk_, committed, kCommittedTimeoutMs);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        logs_.push_back(LogLine{4, std::string("could not read the group's committed offsets: ") +
                                       rd_kafka_err2str(err)});
    for (int i = 0; i < committed->cnt; ++i) {
        rd_kafka_topic_partition_t& tp = committed->elems[i];
        int64_t offset = err == RD_KAFKA_RESP_ERR_NO_ERROR &&
                                 tp.err == RD_KAFKA_RESP_ERR_NO_ERROR && tp.offset >= 0
                             ? tp.offset
                             : -1;
        assigned_[{tp.topic, tp.partition}] = offset;
        acked_[{tp.topic, tp.partition}] = offset;
        // Taken at a concrete offset (never fetched from: paused): a logical one (the committed
        // offset, the end) would be looked up first, and librdkafka does not rejoin the group
        // while a lookup is pending, which it stays in while the partition is paused. The
        // member then missed the next rebalance and was declared lost.
        tp.offset = offset >= 0 ? offset : 0;
        tp.err = RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_error_t* error = nullptr;
    if (cooperative())
        error = rd_kafka_incremental_assign(rk_, committed);
    else
        rd_kafka_assign(rk_, committed);
    rd_kafka_topic_partition_list_destroy(committed);
    if (error != nullptr) {
        logs_.push_back(LogLine{4, std::string("could not take the group's partitions: ") +
                                       rd_kafka_error_string(error)});
        rd_kafka_error_destroy(error);
    }
    rd_kafka_pause_partitions(rk_, partitions);
    ++changes_;
    logs_.push_back(LogLine{6, "consumer group: " + std::to_string(partitions->cnt) +
                                   " partition(s) assigned, " + std::to_string(assigned_.size()) +
                                   " held"});
}

void GroupMember::revoke(rd_kafka_topic_partition_list_t* partitions, bool lost) {
    // Nothing is in flight here: serve() runs between batches, after the last one's database
    // commit. What it stored is committed to the group before the partitions go (unless they
    // are lost: another member holds them already and the commit would be refused).
    if (!lost && partitions != nullptr) commit_owed_now(partitions);
    if (partitions == nullptr || !cooperative()) {
        assigned_.clear();
        rd_kafka_assign(rk_, nullptr);
    } else {
        for (int i = 0; i < partitions->cnt; ++i)
            assigned_.erase({partitions->elems[i].topic, partitions->elems[i].partition});
        rd_kafka_error_t* error = rd_kafka_incremental_unassign(rk_, partitions);
        if (error != nullptr) rd_kafka_error_destroy(error);
    }
    ++changes_;
    logs_.push_back(
        LogLine{6, "consumer group: " + std::to_string(partitions ? partitions->cnt : 0) +
                       " partition(s) released" + (lost ? " (lost)" : "") + ", " +
                       std::to_string(assigned_.size()) + " held"});
}

void GroupMember::commit_owed_now(const rd_kafka_topic_partition_list_t* among) {
    rd_kafka_topic_partition_list_t* list = owed(among);
    if (list->cnt > 0) {
        rd_kafka_resp_err_t err = commit_now(list);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            acknowledge(list);
        else
            logs_.push_back(LogLine{4, std::string("could not commit offsets to the group "
                                                   "before releasing partitions: ") +
                                           rd_kafka_err2str(err)});
    }
    rd_kafka_topic_partition_list_destroy(list);
}

void GroupMember::started(const std::string& topic, int32_t partition, int64_t next) {
    TopicPartition tp{topic, partition};
    if (!assigned_.count(tp)) return;
    int64_t& acked = acked_[tp];
    if (acked < 0) acked = next;
}

rd_kafka_resp_err_t GroupMember::commit_now(rd_kafka_topic_partition_list_t* offsets) {
    // On a queue of its own, waited for at most kCommittedTimeoutMs: a coordinator away must
    // not hold a revocation, or the worker's exit (the close revokes too), for long.
    rd_kafka_queue_t* queue = rd_kafka_queue_new(rk_);
    rd_kafka_resp_err_t err = rd_kafka_commit_queue(rk_, offsets, queue, nullptr, nullptr);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_event_t* event = rd_kafka_queue_poll(queue, kCommittedTimeoutMs);
        if (event == nullptr) {
            err = RD_KAFKA_RESP_ERR__TIMED_OUT;
        } else {
            err = rd_kafka_event_error(event);
            rd_kafka_event_destroy(event);
        }
    }
    rd_kafka_queue_destroy(queue);
    return err;
}

void GroupMember::stored(const std::string& topic, int32_t partition, int64_t next) {
    stored_[{topic, partition}] = next;
}

rd_kafka_topic_partition_list_t* GroupMember::owed(
    const rd_kafka_topic_partition_list_t* among) const {
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(4);
    auto add = [&](const TopicPartition& tp) {
        auto s = stored_.find(tp);
        if (s == stored_.end()) return;
        auto a = acked_.find(tp);
        if (a != acked_.end() && a->second >= s->second) return;
        rd_kafka_topic_partition_list_add(list, tp.first.c_str(), tp.second)->offset = s->second;
    };
    if (among == nullptr) {
        for (const auto& [tp, offset] : assigned_) add(tp);
    } else {
        for (int i = 0; i < among->cnt; ++i) {
            TopicPartition tp{among->elems[i].topic, among->elems[i].partition};
            if (assigned_.count(tp)) add(tp);
        }
    }
    return list;
}

void GroupMember::commit() {
    if (in_flight_ || std::chrono::steady_clock::now() < retry_at_) return;
    rd_kafka_topic_partition_list_t* list = owed(nullptr);
    if (list->cnt > 0) {
        // The result comes to on_commit(), served by serve().
        rd_kafka_resp_err_t err = rd_kafka_commit(rk_, list, 1);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            in_flight_ = true;
        else
            logs_.push_back(LogLine{
                6, std::string("could not commit offsets to the group: ") + rd_kafka_err2str(err)});
    }
    rd_kafka_topic_partition_list_destroy(list);
}

void GroupMember::on_commit(rd_kafka_t*, rd_kafka_resp_err_t err,
                            rd_kafka_topic_partition_list_t* offsets, void* opaque) {
    GroupMember* self = member_of(opaque);
    self->in_callback([&] {
        self->in_flight_ = false;
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR && offsets != nullptr) {
            self->acknowledge(offsets);
        } else if (err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            // Refused while the group rebalances: tried again a little later, not in a loop that
            // would crowd the coordinator's connection.
            self->retry_at_ = std::chrono::steady_clock::now() + kCommitRetry;
            self->logs_.push_back(
                LogLine{6, std::string("committing offsets to the group failed (retried): ") +
                               rd_kafka_err2str(err)});
        }
    });
}

void GroupMember::acknowledge(const rd_kafka_topic_partition_list_t* offsets) {
    for (int i = 0; i < offsets->cnt; ++i) {
        const rd_kafka_topic_partition_t& tp = offsets->elems[i];
        if (tp.err != RD_KAFKA_RESP_ERR_NO_ERROR || tp.offset < 0) continue;
        int64_t& acked = acked_[{tp.topic, tp.partition}];
        acked = std::max(acked, tp.offset);
    }
    ++acknowledged_;
}

int64_t GroupMember::uncommitted() const noexcept {
    int64_t owed = 0;
    for (const auto& [tp, group_offset] : assigned_) {
        auto s = stored_.find(tp);
        if (s == stored_.end()) continue;
        auto a = acked_.find(tp);
        int64_t acked = a == acked_.end() ? -1 : a->second;
        if (acked >= 0 && s->second > acked) owed += s->second - acked;
    }
    return owed;
}

}  // namespace eventbox::kafka
