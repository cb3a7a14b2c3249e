// Unit tests of the relay's RabbitMQ publisher (amqp/publisher.hpp) without a broker: rows it
// cannot publish (no destination, a key too long for a routing key, settings that cannot be
// used, a node that refuses the connection) and what it says about them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "amqp/connection.hpp"
#include "amqp/publisher.hpp"

namespace eventbox::amqp {
namespace {

std::vector<Destination> one_destination() {
    Destination d;
    d.topic = "orders";
    d.exchange = "shop";
    return {d};
}

relay::Row row(const char* topic, const std::string& key) {
    relay::Row r;
    r.id = 7;
    r.message_id = "0b9a4d3e-8a1f-4c1e-9a43-5d0f2f0c6b11";
    r.topic = topic;
    r.key = key.data();
    r.key_len = key.size();
    r.payload = "{}";
    r.payload_len = 2;
    return r;
}

TEST(AmqpPublisher, RefusesEveryRowWithTheReasonWhenNotConfigured) {
    Publisher p(Settings(), one_destination(), 10);
    p.refuse_all("RabbitMQ is not configured: eventbox.amqp_url is empty");
    std::string error;
    std::string key = "k1";
    EXPECT_EQ(p.produce(row("orders", key), error), relay::Produced::kFailed);
    EXPECT_EQ(error, "RabbitMQ is not configured: eventbox.amqp_url is empty");
    EXPECT_EQ(p.fd(), -1);  // no connection was attempted
    EXPECT_TRUE(p.outcomes().empty());
    EXPECT_EQ(p.unconfirmed(), 0u);
}

TEST(AmqpPublisher, LeavesOtherTopicsAndRefusesLongRoutingKeys) {
    Publisher p(Settings(), one_destination(), 10);
    std::string error;
    std::string key = "k1";
    EXPECT_EQ(p.produce(row("payments", key), error), relay::Produced::kUnrouted);
    std::string long_key(256, 'k');
    EXPECT_EQ(p.produce(row("orders", long_key), error), relay::Produced::kFailedPermanently);
    EXPECT_NE(error.find("255"), std::string::npos) << error;
}

TEST(AmqpPublisher, RefusedConnectionFailsTheRowWithoutCredentials) {
    Settings s;
    s.host = "127.0.0.1";
    s.port = 1;  // privileged and unused on loopback: the connection is refused at once
    s.user = "relay-user-x";
    s.password = "pw-9f8e7d";
    Publisher p(s, one_destination(), 10);
    std::string error;
    std::string key = "k1";
    ASSERT_EQ(p.produce(row("orders", key), error), relay::Produced::kQueued);
    ASSERT_EQ(p.outcomes().size(), 1u);
    const Outcome& o = p.outcomes()[0];
    EXPECT_FALSE(o.delivered);
    EXPECT_FALSE(o.permanent);  // retried with backoff, never given up
    EXPECT_TRUE(o.counts);
    EXPECT_EQ(o.error.rfind("not connected to RabbitMQ: connect: ", 0), 0u) << o.error;
    EXPECT_EQ(o.error.find("pw-9f8e7d"), std::string::npos);
    EXPECT_EQ(o.error.find("relay-user-x"), std::string::npos);
    EXPECT_EQ(p.unconfirmed(), 0u);
}

TEST(AmqpReplyText, SaysTheLibrarysReasonAndNoCode) {
    amqp_rpc_reply_t reply{};
    reply.reply_type = AMQP_RESPONSE_LIBRARY_EXCEPTION;
    reply.library_error = AMQP_STATUS_SOCKET_ERROR;
    int code = 5;
    EXPECT_EQ(reply_text(reply, &code), amqp_error_string2(AMQP_STATUS_SOCKET_ERROR));
    EXPECT_EQ(code, 0);
    reply.reply_type = AMQP_RESPONSE_NONE;
    EXPECT_EQ(reply_text(reply), "no reply");
}

TEST(AmqpReplyText, SaysTheBrokersCodeAndText) {
    amqp_connection_close_t close{};
    close.reply_code = 403;
    close.reply_text = amqp_cstring_bytes("ACCESS_REFUSED - Login was refused");
    amqp_rpc_reply_t reply{};
    reply.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
    reply.reply.id = AMQP_CONNECTION_CLOSE_METHOD;
    reply.reply.decoded = &close;
    int code = 0;
    EXPECT_EQ(reply_text(reply, &code), "403 ACCESS_REFUSED - Login was refused");
    EXPECT_EQ(code, -1);  // the connection is gone
    amqp_channel_close_t channel{};
    channel.reply_code = 404;
    channel.reply_text = amqp_cstring_bytes("NOT_FOUND - no queue 'q'");
    reply.reply.id = AMQP_CHANNEL_CLOSE_METHOD;
    reply.reply.decoded = &channel;
    EXPECT_EQ(reply_text(reply, &code), "404 NOT_FOUND - no queue 'q'");
    EXPECT_EQ(code, 404);
}

}  // namespace
}  // namespace eventbox::amqp
