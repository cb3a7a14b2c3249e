// The ingest worker's consumer, shared by its subscriptions (see kafka/consumer.hpp).
#include "kafka/consumer.hpp"

#include <algorithm>
#include <string_view>

#include "core/error.hpp"

namespace eventbox::kafka {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kRefreshInterval = std::chrono::seconds(10);  // new partitions of known topics
constexpr auto kMaintainInterval = std::chrono::seconds(1);
// How long one metadata request may block the worker's loop (a broker away makes it time out).
constexpr int kMetadataTimeoutMs = 500;
// Lines logged for topics without partitions per refresh; the rest are counted in one line.
constexpr int kMissingTopicLogs = 5;
constexpr auto kCommitInterval = std::chrono::seconds(5);  // Kafka commits, per subscription
constexpr int kMaxBackoffMs = 60000;
constexpr std::size_t kCommitsPerPoll = 20;

int next_backoff(int backoff_ms) {
    return std::min(std::max(backoff_ms * 2, 1000), kMaxBackoffMs);
}

std::string where(const TopicPartition& tp) {
    return tp.first + "[" + std::to_string(tp.second) + "]";
}

}  // namespace

int partition_owner(const std::string& topic, int32_t partition, int members) {
    if (members <= 1) return 0;
    uint32_t h = 2166136261u;  // FNV-1a: stable across processes and releases
    for (unsigned char c : topic) h = (h ^ c) * 16777619u;
    uint64_t slot = static_cast<uint64_t>(h) + static_cast<uint32_t>(partition);
    return static_cast<int>(slot % static_cast<uint64_t>(members));
}

Consumer::Consumer(const ConsumerConfig& config)
    : member_(config.member), members_(config.members < 1 ? 1 : config.members) {
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
    if (!owns(topic, partition)) return false;
    Position& p = sub(id).positions[{topic, partition}];
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
    for (auto& [tp, p] : s.positions) p.next = p.stored;
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

const std::string& Consumer::problem(int id) const noexcept {
    auto it = subs_.find(id);
    return it == subs_.end() ? no_problem_ : it->second->problem;
}

bool Consumer::start_position(Sub& s, const std::string& topic, int32_t partition,
                              Position* position) {
    if (!s.config.start_latest && !s.config.backfill) {
        position->next = 0;  // the beginning: an offset before it is reset to the earliest
        return true;
    }
    // 'latest' means: from when the subscription was created. The first message at or after that
    // time, else the current end; pinned and stored at once.
    int64_t found = offset_for_time(topic.c_str(), partition, s.config.latest_since_ms);
    if (found == -1) {
        int64_t low = -1, high = -1;
        rd_kafka_resp_err_t err =
            rd_kafka_query_watermark_offsets(rk_, topic.c_str(), partition, &low, &high, 2000);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            found = -2;
            lookup_error_ = rd_kafka_err2str(err);
        } else if (low < high && offset_for_time(topic.c_str(), partition, 0) == -1) {
            // Every message has a timestamp >= 0, so the broker cannot look offsets up by time:
            // read the partition from its start once and skip the older messages. A backfill
            // takes the end as it is now.
            if (s.config.backfill) {
                found = high;
            } else {
                position->skip_before_ms = s.config.latest_since_ms;
                position->next = 0;
                return true;
            }
        } else {
            found = high;
        }
    }
    if (found < 0) {
        s.start_problem =
            "could not resolve where " + where({topic, partition}) +
            (s.config.backfill ? " stood when the subscription was created (backfill): "
                               : " starts for start_from 'latest': ") +
            lookup_error_;
        return false;
    }
    if (s.config.backfill) {
        // From the beginning; what was there at creation runs in mode 'backfill'. Stored at
        // once, with the boundary, so a restart keeps both.
        position->next = 0;
        position->backfill_until = found;
        s.initial[{topic, partition}] = 0;
        return true;
    }
    position->next = found;
    position->stored = found;
    s.initial[{topic, partition}] = found;
    return true;
}

int64_t Consumer::offset_for_time(const char* topic, int32_t partition, int64_t ms) {
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic, partition)->offset = ms;
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(rk_, list, 2000);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) err = list->elems[0].err;
    int64_t found = err == RD_KAFKA_RESP_ERR_NO_ERROR ? list->elems[0].offset : -2;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) lookup_error_ = rd_kafka_err2str(err);
    rd_kafka_topic_partition_list_destroy(list);
    return found;
}

void Consumer::refresh_topics(const std::vector<std::string>& due) {
    // One request for the whole cluster's topics, whatever their number: a request per topic
    // waits behind the consumer's fetch long-poll on the same connection (~100 ms each), which
    // made 1,000 topics take 100 s to refresh (and the worker deaf to shutdown meanwhile).
    const rd_kafka_metadata_t* md = nullptr;
    ++metadata_requests_;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk_, 1, nullptr, &md, kMetadataTimeoutMs);
    std::map<std::string_view, const rd_kafka_metadata_topic_t*> found;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        for (int i = 0; i < md->topic_cnt; ++i) found[md->topics[i].topic] = &md->topics[i];
    for (const std::string& name : due) {
        auto it = found.find(name);
        rd_kafka_resp_err_t why = err != RD_KAFKA_RESP_ERR_NO_ERROR ? err
                                  : it == found.end() ? RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC
                                                      : it->second->err;
        if (why == RD_KAFKA_RESP_ERR_NO_ERROR)
            topic_found(name, *it->second);
        else
            topic_missing(name, why);
    }
    if (md != nullptr) rd_kafka_metadata_destroy(md);
}

void Consumer::topic_found(const std::string& name, const rd_kafka_metadata_topic_t& md) {
    Topic& topic = topics_[name];
    std::vector<int32_t> owned;
    for (int i = 0; i < md.partition_cnt; ++i) {
        int32_t partition = md.partitions[i].id;
        if (owns(name, partition)) owned.push_back(partition);
    }
    std::sort(owned.begin(), owned.end());
    if (!topic.known || owned != topic.partitions) changed_ = true;
    topic.partitions = std::move(owned);
    topic.known = true;
    if (!topic.error.empty()) changed_ = true;
    topic.error.clear();
    topic.backoff_ms = 0;
    topic.next_refresh = Clock::now() + kRefreshInterval;
}

void Consumer::topic_missing(const std::string& name, rd_kafka_resp_err_t why) {
    Topic& topic = topics_[name];
    // A topic read before keeps its partitions (the broker may be away for a while); one never
    // seen is a problem of the subscriptions that name it.
    if (!topic.known) topic.error = "topic " + name + ": " + rd_kafka_err2str(why);
    topic.backoff_ms = next_backoff(topic.backoff_ms);
    topic.next_refresh = Clock::now() + std::chrono::milliseconds(topic.backoff_ms);
    ++missing_in_refresh_;
    if (missing_in_refresh_ <= kMissingTopicLogs)
        logs_.push_back(LogLine{topic.known ? 6 : 4, "no partitions for topic " + name +
                                                         " yet: " + rd_kafka_err2str(why)});
}

void Consumer::maintain() {
    auto now = Clock::now();
    changed_ = false;
    next_maintain_ = now + kMaintainInterval;
    last_rkt_ = nullptr;
    last_ = nullptr;

    // The topics of every subscription (paused ones keep theirs: they come back soon).
    std::set<std::string> wanted;
    for (auto& [id, s] : subs_) wanted.insert(s->config.topics.begin(), s->config.topics.end());
    for (auto it = topics_.begin(); it != topics_.end();)
        it = wanted.count(it->first) ? std::next(it) : topics_.erase(it);
    // Every due topic in one metadata request; the others that are known ride along, so that
    // topics refresh together (one request per interval) instead of one after another.
    std::vector<std::string> due;
    for (const std::string& name : wanted)
        if (now >= topics_[name].next_refresh) due.push_back(name);
    if (!due.empty()) {
        for (const std::string& name : wanted) {
            const Topic& topic = topics_[name];
            if (now < topic.next_refresh && topic.known && topic.error.empty()) due.push_back(name);
        }
        missing_in_refresh_ = 0;
        refresh_topics(due);
        if (missing_in_refresh_ > kMissingTopicLogs)
            logs_.push_back(LogLine{4, "and " +
                                           std::to_string(missing_in_refresh_ - kMissingTopicLogs) +
                                           " more topics without partitions yet"});
    }

    // Positions of the partitions the subscriptions do not read yet: the stored offset, else the
    // start position. A subscription whose start cannot be resolved retries on its own.
    for (auto& [id, sp] : subs_) {
        Sub& s = *sp;
        if (s.paused) continue;
        bool may_try = now >= s.next_start_try;
        bool unresolved = false;
        for (const std::string& name : s.config.topics) {
            const Topic& topic = topics_[name];
            for (int32_t partition : topic.partitions) {
                Position& p = s.positions[{name, partition}];
                if (p.next >= 0) continue;
                if (p.stored >= 0)
                    p.next = p.stored;
                else if (!may_try || !start_position(s, name, partition, &p))
                    unresolved = true;
            }
        }
        if (!unresolved) {
            s.start_problem.clear();
            s.start_backoff_ms = 0;
        } else if (may_try) {
            s.start_backoff_ms = next_backoff(s.start_backoff_ms);
            s.next_start_try = now + std::chrono::milliseconds(s.start_backoff_ms);
        }
    }

    update_assignment();
    update_problems();
}

void Consumer::update_assignment() {
    // Partitions some subscription reads (or will, once resumed).
    std::set<TopicPartition> wanted;
    for (const auto& [name, topic] : topics_)
        for (int32_t partition : topic.partitions) wanted.insert({name, partition});

    rd_kafka_topic_partition_list_t* drop = rd_kafka_topic_partition_list_new(4);
    for (auto it = partitions_.begin(); it != partitions_.end();) {
        if (wanted.count(it->first)) {
            it->second.readers.clear();
            ++it;
            continue;
        }
        rd_kafka_topic_partition_list_add(drop, it->first.first.c_str(), it->first.second);
        it = partitions_.erase(it);
    }
    if (drop->cnt > 0) {
        rd_kafka_error_t* error = rd_kafka_incremental_unassign(rk_, drop);
        if (error != nullptr) {
            logs_.push_back(LogLine{
                4, std::string("could not unassign partitions: ") + rd_kafka_error_string(error)});
            rd_kafka_error_destroy(error);
        }
    }
    rd_kafka_topic_partition_list_destroy(drop);

    // Readers: subscriptions not paused, at a resolved position.
    std::map<TopicPartition, std::vector<Reader>> readers;
    for (auto& [id, sp] : subs_) {
        if (sp->paused) continue;
        for (auto& [tp, p] : sp->positions)
            if (p.next >= 0 && wanted.count(tp)) readers[tp].push_back(Reader{sp.get(), &p, &tp});
    }

    rd_kafka_topic_partition_list_t* add = rd_kafka_topic_partition_list_new(4);
    rd_kafka_topic_partition_list_t* pause = rd_kafka_topic_partition_list_new(4);
    rd_kafka_topic_partition_list_t* resume = rd_kafka_topic_partition_list_new(4);
    rd_kafka_topic_partition_list_t* seek = rd_kafka_topic_partition_list_new(4);
    for (auto& [tp, list] : readers) {
        int64_t lowest = list.front().position->next;
        for (const Reader& r : list) lowest = std::min(lowest, r.position->next);
        auto it = partitions_.find(tp);
        if (it == partitions_.end()) {
            Partition& part = partitions_[tp];
            part.readers = std::move(list);
            part.fetch_next = lowest;
            rd_kafka_topic_partition_list_add(add, tp.first.c_str(), tp.second)->offset = lowest;
            continue;
        }
        Partition& part = it->second;
        part.readers = std::move(list);
        if (part.paused) {
            part.paused = false;
            rd_kafka_topic_partition_list_add(resume, tp.first.c_str(), tp.second);
        }
        // Fetched from the lowest position a reader needs; records below a reader's own
        // position are not handed to it. Never forward: a position beyond the partition's end
        // would be reset to its start, over and over.
        if (part.fetch_next < 0 || lowest < part.fetch_next) {
            rd_kafka_topic_partition_list_add(seek, tp.first.c_str(), tp.second)->offset = lowest;
            part.fetch_next = lowest;
        }
    }
    for (auto& [tp, part] : partitions_) {
        if (!part.readers.empty() || part.paused) continue;
        part.paused = true;
        rd_kafka_topic_partition_list_add(pause, tp.first.c_str(), tp.second);
    }

    if (add->cnt > 0) {
        rd_kafka_error_t* error = rd_kafka_incremental_assign(rk_, add);
        if (error != nullptr) {
            logs_.push_back(LogLine{
                4, std::string("could not assign partitions: ") + rd_kafka_error_string(error)});
            rd_kafka_error_destroy(error);
            for (int i = 0; i < add->cnt; ++i)
                partitions_.erase({add->elems[i].topic, add->elems[i].partition});
            changed_ = true;
        } else {
            logs_.push_back(LogLine{6, "assigned " + std::to_string(add->cnt) + " partition(s)"});
        }
    }
    if (pause->cnt > 0) rd_kafka_pause_partitions(rk_, pause);
    if (resume->cnt > 0) rd_kafka_resume_partitions(rk_, resume);
    if (seek->cnt > 0) {
        // Synchronous: once it returns, librdkafka drops records fetched from before the seek.
        rd_kafka_error_t* error = rd_kafka_seek_partitions(rk_, seek, 5000);
        if (error != nullptr) {
            logs_.push_back(
                LogLine{4, std::string("seek failed: ") + rd_kafka_error_string(error)});
            rd_kafka_error_destroy(error);
            changed_ = true;
        }
        for (int i = 0; i < seek->cnt; ++i) {
            if (seek->elems[i].err == RD_KAFKA_RESP_ERR_NO_ERROR) continue;
            auto it = partitions_.find({seek->elems[i].topic, seek->elems[i].partition});
            if (it != partitions_.end()) it->second.fetch_next = -1;  // try again
            changed_ = true;
        }
    }
    for (auto* list : {add, pause, resume, seek}) rd_kafka_topic_partition_list_destroy(list);
}

void Consumer::update_problems() {
    for (auto& [id, sp] : subs_) {
        Sub& s = *sp;
        std::string problem;
        for (const std::string& name : s.config.topics) {
            const Topic& topic = topics_[name];
            for (const std::string* text : {&topic.error, &topic.fetch_error}) {
                if (text->empty()) continue;
                if (!problem.empty()) problem += "; ";
                problem += *text;
            }
        }
        if (!s.start_problem.empty()) {
            if (!problem.empty()) problem += "; ";
            problem += s.start_problem;
        }
        s.problem = std::move(problem);
    }
}

void Consumer::commit_offsets() {
    auto now = Clock::now();
    std::size_t sent = 0;
    for (auto& [id, sp] : subs_) {
        Sub& s = *sp;
        if (!s.commit_due || s.paused || now < s.next_commit) continue;
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
    if (changed_ || Clock::now() >= next_maintain_) maintain();
    commit_offsets();
    std::size_t read = 0;
    while (read < max) {
        rd_kafka_message_t* msg = rd_kafka_consumer_poll(rk_, 0);
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
    }
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
