// The relay's librdkafka producer (src/kafka/producer.cpp), without a broker: librdkafka does
// not need one to be configured, created, fed and destroyed.
#include "kafka/producer.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "test_util.hpp"

namespace eventbox::kafka {
namespace {

// The relay's PostgreSQL side calls these without a guard (outbox/relay_worker.hpp): they must
// not throw.
static_assert(noexcept(std::declval<const Producer&>().event_fd()));
static_assert(noexcept(std::declval<Producer&>().deliveries()));

using test::all_text;

constexpr const char* kSecret = "hunter2-Sup3rS3cret";
// Nothing listens on port 1: connection attempts fail at once.
constexpr const char* kNoBroker = "127.0.0.1:1";

ProducerConfig config_with(std::vector<KafkaOption> options) {
    ProducerConfig c;
    c.brokers = kNoBroker;
    c.options = std::move(options);
    c.message_timeout_ms = 60000;
    return c;
}

Error construct_error(const ProducerConfig& config) {
    try {
        Producer p(config);
    } catch (const Error& e) {
        return e;
    } catch (...) {
        ADD_FAILURE() << "threw something other than eventbox::Error";
        return Error("XX000", "wrong exception");
    }
    ADD_FAILURE() << "did not throw";
    return Error("XX000", "no exception");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct RowData {
    std::string message_id = "0190a6d2-0000-7000-8000-000000000001";
    std::string topic = "orders";
    std::string key = "k";
    std::string payload = "{\"n\": 1}";
    std::vector<relay::Header> headers = {{"event_type", "OrderCreated"}};
    relay::Row row(int64_t id) const {
        relay::Row r;
        r.id = id;
        r.message_id = message_id;
        r.topic = topic;
        r.key = key.data();
        r.key_len = key.size();
        r.payload = payload.data();
        r.payload_len = payload.size();
        r.headers = headers.data();
        r.n_headers = headers.size();
        return r;
    }
};

// ---- configuration errors name the key, never the value -----------------------------------

TEST(Producer, UnknownOptionKeyIsRefusedByName) {
    Error e = construct_error(config_with({{"no.such.property", kSecret}}));
    EXPECT_STREQ(e.sqlstate(), "F0000");
    EXPECT_NE(std::string(e.what()).find("\"no.such.property\""), std::string::npos) << e.what();
    EXPECT_EQ(all_text(e).find(kSecret), std::string::npos) << all_text(e);
    EXPECT_FALSE(e.hint().empty());
}

TEST(Producer, BadValueOfAKnownKeyIsRefusedWithoutTheValue) {
    for (const char* key :
         {"acks", "linger.ms", "security.protocol", "compression.type", "enable.idempotence"}) {
        Error e = construct_error(config_with({{key, kSecret}}));
        EXPECT_STREQ(e.sqlstate(), "F0000") << key;
        EXPECT_NE(std::string(e.what()).find(std::string("\"") + key + "\""), std::string::npos)
            << e.what();
        EXPECT_EQ(all_text(e).find(kSecret), std::string::npos) << key << ": " << all_text(e);
        EXPECT_EQ(all_text(e).find("Sup3r"), std::string::npos) << all_text(e);
    }
}

TEST(Producer, CredentialsAreAcceptedAsOptions) {
    EXPECT_NO_THROW(Producer p(config_with({{"security.protocol", "SASL_PLAINTEXT"},
                                            {"sasl.mechanism", "PLAIN"},
                                            {"sasl.username", "user"},
                                            {"sasl.password", kSecret}})));
}

TEST(Producer, CreationFailureDoesNotShowCredentials) {
    // Passes rd_kafka_conf_set, fails in rd_kafka_new (the key file does not exist).
    Error e = construct_error(config_with({{"security.protocol", "SSL"},
                                           {"ssl.key.location", "/nonexistent/eventbox-test.key"},
                                           {"ssl.key.password", kSecret}}));
    EXPECT_STREQ(e.sqlstate(), "F0000");
    EXPECT_STREQ(e.what(), "could not create the Kafka producer");
    EXPECT_EQ(all_text(e).find(kSecret), std::string::npos) << all_text(e);
}

// librdkafka's own log lines are relayed to the server log: they must not carry an option
// value either. An unparsable sasl.oauthbearer.config makes librdkafka log part of it.
TEST(Producer, LogLinesDoNotShowOptionValues) {
    const std::string secret = kSecret;
    auto t0 = std::chrono::steady_clock::now();
    {
        Producer p(config_with(
            {{"security.protocol", "SASL_PLAINTEXT"},
             {"sasl.mechanism", "OAUTHBEARER"},
             {"enable.sasl.oauthbearer.unsecure.jwt", "true"},
             {"sasl.oauthbearer.config", "principal=svc bogus=1 extension_token=" + secret}}));
        // Collect for up to 2 s, or until librdkafka has complained about the setting.
        std::vector<std::string> lines;
        bool complained = false;
        for (int i = 0; i < 40 && !complained; ++i) {
            p.poll();
            for (const LogLine& l : p.logs()) {
                lines.push_back(l.text);
                complained = complained || l.text.find("oauthbearer") != std::string::npos;
            }
            p.logs().clear();
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        for (const std::string& line : lines)
            EXPECT_EQ(line.find(secret), std::string::npos) << "log line: " << line;
    }
    EXPECT_LT(seconds_since(t0), 10.0);
}

// ---- lifecycle without a broker -----------------------------------------------------------

TEST(Producer, CreateAndDestroyQuickly) {
    auto t0 = std::chrono::steady_clock::now();
    {
        Producer p(config_with({}));
        EXPECT_GE(p.event_fd(), 0);
        EXPECT_FALSE(p.fatal());
        p.poll();
        EXPECT_TRUE(p.deliveries().empty());
    }
    EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Producer, DestroyWithQueuedMessagesIsQuick) {
    RowData data;
    auto t0 = std::chrono::steady_clock::now();
    {
        Producer p(config_with({}));
        std::string error;
        for (int64_t id = 1; id <= 100; ++id)
            ASSERT_EQ(p.produce(data.row(id), error), relay::Produced::kQueued) << error;
    }
    EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Producer, ProduceCopiesTheRow) {
    Producer p(config_with({}));
    std::string error;
    {
        RowData data;  // the row's bytes die right after produce()
        ASSERT_EQ(p.produce(data.row(1), error), relay::Produced::kQueued) << error;
    }
    relay::Row tombstone = RowData().row(2);
    tombstone.payload = nullptr;
    tombstone.payload_len = 0;
    tombstone.key = nullptr;
    tombstone.key_len = 0;
    tombstone.headers = nullptr;
    tombstone.n_headers = 0;
    EXPECT_EQ(p.produce(tombstone, error), relay::Produced::kQueued) << error;
}

TEST(Producer, PurgedMessagesAreReportedAsNotCounting) {
    RowData data;
    Producer p(config_with({}));
    // Served once first, as the relay's loop does: librdkafka signals the fd only when its queue
    // goes from empty to non-empty, and events queued while the producer was being created
    // (before the fd was attached) would otherwise keep it silent.
    p.poll();
    std::string error;
    ASSERT_EQ(p.produce(data.row(41), error), relay::Produced::kQueued) << error;
    ASSERT_EQ(p.produce(data.row(42), error), relay::Produced::kQueued) << error;
    p.purge();
    // The event fd wakes the caller up; poll() then serves the delivery reports.
    struct pollfd pfd = {p.event_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 5000), 1) << "event fd did not become readable";
    auto t0 = std::chrono::steady_clock::now();
    while (p.deliveries().size() < 2 && seconds_since(t0) < 5.0) {
        p.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(p.deliveries().size(), 2u);
    std::vector<int64_t> ids;
    for (const Delivery& d : p.deliveries()) {
        ids.push_back(d.id);
        EXPECT_NE(d.err, 0);
        EXPECT_FALSE(d.counts) << "a purge is not a delivery attempt";
        EXPECT_FALSE(d.permanent);
        EXPECT_FALSE(d.error.empty());
    }
    EXPECT_EQ(ids, (std::vector<int64_t>{41, 42}));
    // poll() drained the wake-up pipe.
    pfd.revents = 0;
    EXPECT_EQ(::poll(&pfd, 1, 0), 0);
}

// ---- error classification -----------------------------------------------------------------

TEST(Producer, PermanentErrors) {
    for (rd_kafka_resp_err_t err :
         {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR_INVALID_MSG,
          RD_KAFKA_RESP_ERR_INVALID_RECORD, RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE,
          RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
          RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION,
          RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, RD_KAFKA_RESP_ERR__INVALID_ARG})
        EXPECT_TRUE(Producer::is_permanent(err)) << rd_kafka_err2name(err);
}

TEST(Producer, TransientErrors) {
    for (rd_kafka_resp_err_t err :
         {RD_KAFKA_RESP_ERR_NO_ERROR, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
          RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
          RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__PURGE_QUEUE,
          RD_KAFKA_RESP_ERR__PURGE_INFLIGHT, RD_KAFKA_RESP_ERR__TIMED_OUT,
          RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
          RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
          RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
          RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
          RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, RD_KAFKA_RESP_ERR__FATAL})
        EXPECT_FALSE(Producer::is_permanent(err)) << rd_kafka_err2name(err);
}

}  // namespace
}  // namespace eventbox::kafka

namespace eventbox::kafka {
namespace {

// Per-key order through outages rests on this default: librdkafka never times a message out, so
// the idempotent producer never leaves a gap that later messages of the key could fill first.
TEST(ProducerConfig, MessagesNeverTimeOutByDefault) {
    ProducerConfig c;
    EXPECT_EQ(c.message_timeout_ms, 0);
    c.brokers = "127.0.0.1:1";
    EXPECT_NO_THROW(Producer p(c))
        << "librdkafka must accept message.timeout.ms=0 with idempotence";
}

TEST(SecretScrubber, RemovesSensitiveValuesAndTheirParts) {
    SecretScrubber s({{"sasl.password", "hunter2-Sup3rS3cret"},
                      {"sasl.oauthbearer.config", "principal=svc extension_token=tok-abcdef"},
                      {"security.protocol", "SASL_SSL"}});
    EXPECT_EQ(s.scrub("auth failed for hunter2-Sup3rS3cret"), "auth failed for ***");
    EXPECT_EQ(s.scrub("bad config at: extension_token=tok-abcdef"), "bad config at: ***=***");
    EXPECT_EQ(s.scrub("using SASL_SSL"), "using SASL_SSL") << "not a sensitive option";
}

}  // namespace
}  // namespace eventbox::kafka

namespace eventbox::kafka {
namespace {

// Whatever send() accepted (up to eventbox.max_message_bytes) librdkafka takes, framing and all.
TEST(Producer, RecordAtTheSendLimitIsAccepted) {
    ProducerConfig c;
    c.brokers = "127.0.0.1:1";
    c.max_message_bytes = 1000000;
    Producer p(c);
    RowData data;
    data.payload = std::string(1000000 - 100, 'x');
    std::string error;
    EXPECT_EQ(p.produce(data.row(1), error), relay::Produced::kQueued) << error;
}

}  // namespace
}  // namespace eventbox::kafka
