// The consumer's topics and assignment (see kafka/consumer.hpp): the topics' metadata, read for
// all of them in one request; where a partition nobody read yet starts; which partitions are
// assigned, paused, resumed or sought; the subscriptions' problems.
#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "kafka/consumer.hpp"
#include "kafka/consumer_internal.hpp"

namespace eventbox::kafka {

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
        if (s.member) unresolved = !place_group_positions(s, may_try);
        for (const std::string& name : s.config.topics) {
            if (s.member) break;
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

bool Consumer::place_group_positions(Sub& s, bool may_try) {
    // The later of what this server stored and what the group committed, else start_from.
    bool resolved = true;
    for (const auto& [tp, group_offset] : s.member->assigned()) {
        Position& p = s.positions[tp];
        if (p.next >= 0) continue;
        int64_t base = std::max(p.stored, group_offset);
        if (base >= 0) {
            p.next = base;
        } else if (!may_try || !start_position(s, tp.first, tp.second, &p)) {
            resolved = false;
            continue;
        }
        s.member->started(tp.first, tp.second, p.next);
    }
    return resolved;
}

void Consumer::update_assignment() {
    // Partitions some subscription reads (or will, once resumed): this worker's share of the
    // direct subscriptions' topics, and what the groups give it.
    std::set<TopicPartition> wanted;
    std::set<std::string> direct;
    for (const auto& [id, s] : subs_) {
        if (s->member == nullptr)
            direct.insert(s->config.topics.begin(), s->config.topics.end());
        else
            for (const auto& [tp, offset] : s->member->assigned()) wanted.insert(tp);
    }
    for (const auto& [name, topic] : topics_)
        if (direct.count(name))
            for (int32_t partition : topic.partitions) wanted.insert({name, partition});
    unassign_unwanted(wanted);
    Changes changes = place_readers(wanted);
    for (auto& [tp, part] : partitions_) {
        if (!part.readers.empty() || part.paused) continue;
        part.paused = true;
        rd_kafka_topic_partition_list_add(changes.pause, tp.first.c_str(), tp.second);
    }
    apply(changes);
}

void Consumer::unassign_unwanted(const std::set<TopicPartition>& wanted) {
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
}

Consumer::Changes Consumer::place_readers(const std::set<TopicPartition>& wanted) {
    // Readers: subscriptions not paused, at a resolved position.
    std::map<TopicPartition, std::vector<Reader>> readers;
    for (auto& [id, sp] : subs_) {
        if (sp->paused || sp->held) continue;
        for (auto& [tp, p] : sp->positions)
            if (p.next >= 0 && wanted.count(tp) && reads(*sp, tp))
                readers[tp].push_back(Reader{sp.get(), &p, &tp});
    }
    Changes changes;
    for (auto& [tp, list] : readers) {
        int64_t lowest = list.front().position->next;
        for (const Reader& r : list) lowest = std::min(lowest, r.position->next);
        auto it = partitions_.find(tp);
        if (it == partitions_.end()) {
            Partition& part = partitions_[tp];
            part.readers = std::move(list);
            part.fetch_next = lowest;
            rd_kafka_topic_partition_list_add(changes.add, tp.first.c_str(), tp.second)->offset =
                lowest;
            continue;
        }
        Partition& part = it->second;
        part.readers = std::move(list);
        if (part.paused) {
            part.paused = false;
            rd_kafka_topic_partition_list_add(changes.resume, tp.first.c_str(), tp.second);
        }
        // Fetched from the lowest position a reader needs; records below a reader's own
        // position are not handed to it. Never forward: a position beyond the partition's end
        // would be reset to its start, over and over.
        if (part.fetch_next < 0 || lowest < part.fetch_next) {
            rd_kafka_topic_partition_list_add(changes.seek, tp.first.c_str(), tp.second)->offset =
                lowest;
            part.fetch_next = lowest;
        }
    }
    return changes;
}

void Consumer::apply(Changes& changes) {
    rd_kafka_topic_partition_list_t* add = changes.add;
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
            // librdkafka keeps a partition's pause across its unassignment: one paused when it
            // was released (no reader) would never be fetched again.
            rd_kafka_resume_partitions(rk_, add);
            logs_.push_back(LogLine{6, "assigned " + std::to_string(add->cnt) + " partition(s)"});
        }
    }
    if (changes.pause->cnt > 0) rd_kafka_pause_partitions(rk_, changes.pause);
    if (changes.resume->cnt > 0) rd_kafka_resume_partitions(rk_, changes.resume);
    if (changes.seek->cnt > 0) seek(changes.seek);
}

void Consumer::seek(rd_kafka_topic_partition_list_t* seek) {
    // Synchronous: once it returns, librdkafka drops records fetched from before the seek.
    rd_kafka_error_t* error = rd_kafka_seek_partitions(rk_, seek, 5000);
    if (error != nullptr) {
        logs_.push_back(LogLine{4, std::string("seek failed: ") + rd_kafka_error_string(error)});
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

}  // namespace eventbox::kafka
