// Membership 'group' (kafka/group_member.hpp) against librdkafka's mock cluster: the member's
// group.instance.id, the partitions a group gives a subscription, the offsets committed to the
// group after each stored batch, and where a partition starts when it comes to another server
// (the later of that server's stored offset and the group's); and a member destroyed between
// its JoinGroup and its first assignment, which librdkafka 2.0.2 answers with an abort.
#include "kafka/group_member.hpp"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kafka/consumer.hpp"

namespace {

using eventbox::kafka::Consumer;
using eventbox::kafka::ConsumerConfig;
using eventbox::kafka::group_instance_id;
using eventbox::kafka::GroupMember;
using eventbox::kafka::SubscriptionConfig;

constexpr int kPartitions = 4;

// A mock cluster of one broker with one topic "orders" of kPartitions partitions, and a producer.
class MockCluster {
  public:
    MockCluster() {
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        char errstr[256];
        rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof errstr);
        rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
        mock_ = rd_kafka_mock_cluster_new(rk_, 1);
        rd_kafka_mock_topic_create(mock_, "orders", kPartitions, 1);
        rd_kafka_conf_t* pconf = rd_kafka_conf_new();
        rd_kafka_conf_set(pconf, "bootstrap.servers", bootstraps().c_str(), errstr, sizeof errstr);
        rd_kafka_conf_set(pconf, "log_level", "0", errstr, sizeof errstr);
        producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, pconf, errstr, sizeof errstr);
    }
    ~MockCluster() {
        rd_kafka_destroy(producer_);
        rd_kafka_mock_cluster_destroy(mock_);
        rd_kafka_destroy(rk_);
    }
    std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(mock_); }
    // Every answer of the broker comes rtt_ms late.
    void set_rtt(int rtt_ms) { rd_kafka_mock_broker_set_rtt(mock_, 1, rtt_ms); }
    // The next n SyncGroup requests (API key 14) are refused: the group rebalances.
    void refuse_sync_groups(std::size_t n) {
        std::vector<rd_kafka_resp_err_t> errors(n, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
        rd_kafka_mock_push_request_errors_array(mock_, 14, n, errors.data());
    }
    // n records into partition 0.
    void produce(int n) {
        for (int i = 0; i < n; ++i)
            rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC("orders"), RD_KAFKA_V_PARTITION(0),
                              RD_KAFKA_V_VALUE(const_cast<char*>("{}"), 2), RD_KAFKA_V_END);
        rd_kafka_flush(producer_, 10000);
    }

  private:
    rd_kafka_t* rk_;
    rd_kafka_t* producer_;
    rd_kafka_mock_cluster_t* mock_;
};

// Polls `consumer` until `done` (a functional wait, not a timing assertion: 60 s at most).
bool poll_until(Consumer& consumer, const std::function<bool()>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
        consumer.poll(100);
        if (done()) return true;
        consumer.release();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
}

std::unique_ptr<Consumer> group_consumer(const MockCluster& cluster, const std::string& server,
                                         int* id) {
    ConsumerConfig config;
    config.brokers = cluster.bootstraps();
    config.group_id = "eventbox-unit";
    config.instance_base = server;
    auto consumer = std::make_unique<Consumer>(config);
    SubscriptionConfig sub;
    sub.name = "orders";
    sub.group_id = "unit-group";
    sub.topics = {"orders"};
    sub.group = true;
    *id = consumer->add_subscription(sub);
    return consumer;
}

TEST(GroupInstanceId, NamesServerAndSubscriptionInKafkasAlphabet) {
    EXPECT_EQ(group_instance_id("7301.16384.0", "orders"), "pg_eventbox.7301.16384.0.orders");
    // Bytes outside [A-Za-z0-9._-] (each byte of a multibyte character too) become "_".
    EXPECT_EQ(group_instance_id("1.2.0", "ordres été/v2"), "pg_eventbox.1.2.0.ordres___t___v2");
    EXPECT_EQ(group_instance_id("1.2.0", std::string(400, 'x')).size(), 249u);
}

TEST(GroupMember, APartitionMovesOnAtTheLaterOfStoredAndCommittedOffsets) {
    MockCluster cluster;
    cluster.produce(10);
    int first_id = 0;
    {
        // Server A holds every partition, stores records 0..9 of partition 0 and commits them
        // to the group.
        auto a = group_consumer(cluster, "A", &first_id);
        a->resume(first_id);
        ASSERT_TRUE(poll_until(*a, [&] { return a->group_partitions(first_id) == kPartitions; }));
        ASSERT_TRUE(poll_until(*a, [&] { return a->batch(first_id).size() == 10u; }));
        const auto& ends = a->partition_ends(first_id, 0, 10);
        ASSERT_EQ(ends.size(), 1u);
        EXPECT_EQ(ends[0].next_offset, 10);
        a->committed(first_id);
        a->release();
        EXPECT_EQ(a->group_uncommitted(first_id), 10);
        ASSERT_TRUE(poll_until(*a, [&] { return a->group_uncommitted(first_id) == 0; }));
    }  // A stops: a static member does not leave; the group waits out its session.
    cluster.produce(5);
    // Server B once stored offset 3 in partition 0 (it held it before A): it starts at 10, the
    // group's offset, not at 3.
    int id = 0;
    auto b = group_consumer(cluster, "B", &id);
    b->set_stored_offset(id, "orders", 0, 3);
    b->resume(id);
    ASSERT_TRUE(poll_until(*b, [&] { return b->batch(id).size() >= 5u; }));
    EXPECT_EQ(b->batch(id).front()->offset, 10);
    EXPECT_EQ(b->batch(id).size(), 5u);
    EXPECT_EQ(b->group_partitions(id), kPartitions);
}

// Member `name` of group `group`, on topic "orders".
GroupMember::Config member_config(const MockCluster& cluster, const char* group, const char* name) {
    GroupMember::Config config;
    config.brokers = cluster.bootstraps();
    config.group_id = group;
    config.instance_id = std::string("pg_eventbox.unit.") + name;
    config.topics = {"orders"};
    return config;
}

// A member alone in group "window": served until the group chose its assignor and its first
// assignment has not come, then destroyed. Exits 0 when the destructor returned and
// GroupMember::abandoned() is `abandoned`, 2 or 3 otherwise (librdkafka's abort: SIGABRT).
void destroy_in_the_window(MockCluster& cluster, uint64_t abandoned) {
    auto member = std::make_unique<GroupMember>(member_config(cluster, "window", "window"));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!member->awaiting_first_assignment() && std::chrono::steady_clock::now() < deadline)
        member->serve(50);
    if (!member->awaiting_first_assignment()) std::exit(2);
    member.reset();
    std::exit(GroupMember::abandoned() == abandoned ? 0 : 3);
}

class GroupMemberWindow : public ::testing::Test {
  protected:
    // Run in a new process of this binary (librdkafka's threads make fork() unsafe).
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(GroupMemberWindow, DestroyedBeforeItsFirstAssignmentWaitsForIt) {
    // Answers 1 s late: the SyncGroup's comes 1 s after the JoinGroup's chose the assignor.
    EXPECT_EXIT(
        {
            MockCluster cluster;
            cluster.set_rtt(1000);
            destroy_in_the_window(cluster, 0);
        },
        ::testing::ExitedWithCode(0), "");
}

TEST_F(GroupMemberWindow, LeftOpenWhenItsFirstAssignmentNeverComes) {
    // Every SyncGroup refused: no assignment within the destructor's wait.
    EXPECT_EXIT(
        {
            MockCluster cluster;
            cluster.refuse_sync_groups(1000);
            destroy_in_the_window(cluster, 1);
        },
        ::testing::ExitedWithCode(0), "");
}

TEST_F(GroupMemberWindow, DestroyedWhileTheGroupTakesPartitionsAway) {
    // Member A holds every partition, with offsets owed; B joins and the group asks A for some of
    // them back; A, not served meanwhile, is destroyed with that revocation pending: the close
    // serves it after the group's sub-system ended, when librdkafka no longer names the
    // protocol (rd_kafka_rebalance_protocol() returns null: a strcmp() of it crashed, signal 11).
    EXPECT_EXIT(
        {
            MockCluster cluster;
            auto a = std::make_unique<GroupMember>(member_config(cluster, "taken", "a"));
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (a->assigned().size() < kPartitions &&
                   std::chrono::steady_clock::now() < deadline)
                a->serve(50);
            if (a->assigned().size() != kPartitions) std::exit(2);
            a->started("orders", 0, 0);
            a->stored("orders", 0, 10);
            GroupMember b(member_config(cluster, "taken", "b"));
            // The mock holds the rebalance about a session (10 s) for A to rejoin.
            auto until = std::chrono::steady_clock::now() + std::chrono::seconds(12);
            while (std::chrono::steady_clock::now() < until) b.serve(50);
            a.reset();
            std::exit(0);
        },
        ::testing::ExitedWithCode(0), "");
}

}  // namespace
