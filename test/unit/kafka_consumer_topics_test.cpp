// The consumer with many topics (issue 27, item 1): one metadata request refreshes them all, so
// subscriptions on a thousand topics start as fast as on one, against librdkafka's mock cluster.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kafka/consumer.hpp"

namespace {

using eventbox::kafka::Consumer;
using eventbox::kafka::ConsumerConfig;
using eventbox::kafka::SubscriptionConfig;

// A mock cluster of one broker with `topics` one-partition topics t0, t1, ...
class MockCluster {
  public:
    explicit MockCluster(int topics) {
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        char errstr[256];
        rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof errstr);
        rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
        mock_ = rd_kafka_mock_cluster_new(rk_, 1);
        for (int t = 0; t < topics; ++t)
            rd_kafka_mock_topic_create(mock_, ("t" + std::to_string(t)).c_str(), 1, 1);
    }
    ~MockCluster() {
        rd_kafka_mock_cluster_destroy(mock_);
        rd_kafka_destroy(rk_);
    }
    std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(mock_); }

  private:
    rd_kafka_t* rk_;
    rd_kafka_mock_cluster_t* mock_;
};

TEST(ConsumerTopics, OneMetadataRequestRefreshesEveryTopic) {
    // (The mock cluster creates topics slowly, ~0.2 s each: 40 are enough to tell one request
    // from one per topic.)
    constexpr int kTopics = 40;
    MockCluster cluster(kTopics);
    ConsumerConfig config;
    config.brokers = cluster.bootstraps();
    config.group_id = "eventbox-unit";
    Consumer consumer(config);
    for (int t = 0; t < kTopics; ++t) {
        SubscriptionConfig sub;
        sub.name = "s" + std::to_string(t);
        sub.group_id = "g" + sub.name;
        sub.topics = {"t" + std::to_string(t)};
        consumer.resume(consumer.add_subscription(sub));
    }
    // A functional wait (every partition assigned), not a timing assertion.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (consumer.assigned_partitions() < kTopics &&
           std::chrono::steady_clock::now() < deadline) {
        consumer.poll(100);
        consumer.release();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(consumer.assigned_partitions(), static_cast<std::size_t>(kTopics));
    // One request for the 40 topics (a few more if the mock broker was slow to answer the first):
    // never one per topic.
    EXPECT_LE(consumer.metadata_requests(), 3u);
}

}  // namespace
