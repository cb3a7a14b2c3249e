// What kafka/consumer.cpp and kafka/consumer_topics.cpp share: the consumer's clock, intervals
// and backoff. Included by those two files only.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include "kafka/consumer.hpp"

namespace eventbox::kafka {

using Clock = std::chrono::steady_clock;

inline constexpr auto kRefreshInterval = std::chrono::seconds(10);  // new partitions of topics
inline constexpr auto kMaintainInterval = std::chrono::seconds(1);
// How long one metadata request may block the worker's loop (a broker away makes it time out).
inline constexpr int kMetadataTimeoutMs = 500;
// Lines logged for topics without partitions per refresh; the rest are counted in one line.
inline constexpr int kMissingTopicLogs = 5;
inline constexpr auto kCommitInterval = std::chrono::seconds(5);  // Kafka commits, per subscription
inline constexpr int kMaxBackoffMs = 60000;
inline constexpr std::size_t kCommitsPerPoll = 20;
// How long a poll waits for a group's acknowledgement of the last batch's offsets (in steps)
// before holding the subscription until the next poll.
inline constexpr int kGroupCommitWaits = 20;
inline constexpr int kGroupCommitWaitMs = 5;

// 1 s, doubling up to a minute.
inline int next_backoff(int backoff_ms) {
    return std::min(std::max(backoff_ms * 2, 1000), kMaxBackoffMs);
}

// "topic[partition]", for messages.
inline std::string where(const TopicPartition& tp) {
    return tp.first + "[" + std::to_string(tp.second) + "]";
}

}  // namespace eventbox::kafka
