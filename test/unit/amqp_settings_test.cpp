// Unit tests of eventbox.amqp_url and eventbox.amqp_options parsing (amqp/settings.hpp).
#include <gtest/gtest.h>

#include <string>

#include "amqp/settings.hpp"
#include "core/error.hpp"

namespace eventbox::amqp {
namespace {

TEST(AmqpUrl, HostPortAndVhost) {
    Settings s;
    parse_url("amqp://127.0.0.1:5682/%2f", s);
    EXPECT_EQ(s.host, "127.0.0.1");
    EXPECT_EQ(s.port, 5682);
    EXPECT_EQ(s.vhost, "/");
    EXPECT_FALSE(s.tls);
    parse_url("amqps://rabbit.example.com/orders", s);
    EXPECT_EQ(s.host, "rabbit.example.com");
    EXPECT_EQ(s.port, 5671);
    EXPECT_EQ(s.vhost, "orders");
    EXPECT_TRUE(s.tls);
    parse_url("amqp://[::1]:5672", s);
    EXPECT_EQ(s.host, "::1");
    EXPECT_EQ(s.vhost, "/");
}

TEST(AmqpSettings, RedactsUserAndPassword) {
    Settings s;
    s.user = "bob";
    s.password = "s3cret";
    EXPECT_EQ(redacted("access to vhost '/' refused for user 'bob'", s),
              "access to vhost '/' refused for user '***'");
    EXPECT_EQ(redacted("s3cret bob s3cret", s), "*** *** ***");
    EXPECT_EQ(redacted("connect: connection refused", s), "connect: connection refused");
    s.user = "***";  // a value containing its replacement still ends
    EXPECT_EQ(redacted("user ***", s), "user ***");
    s.user.clear();
    s.password.clear();
    EXPECT_EQ(redacted("no secrets", s), "no secrets");
}

TEST(AmqpUrl, RejectsCredentialsWithoutEchoingThem) {
    Settings s;
    try {
        parse_url("amqp://bob:s3cret@host/", s);
        FAIL() << "accepted user information";
    } catch (const Error& e) {
        EXPECT_STREQ(e.sqlstate(), "22023");
        EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("user information"), std::string::npos);
    }
}

TEST(AmqpUrl, RejectsBadShapes) {
    Settings s;
    for (const char* bad :
         {"http://host", "amqp://", "amqp://host:0", "amqp://host:70000", "amqp://host:x",
          "amqp://host/%zz", "amqp://host/a b", "amqp://host/?heartbeat=5"})
        EXPECT_THROW(parse_url(bad, s), Error) << bad;
    char why[256];
    EXPECT_FALSE(url_valid("amqp://host:0", why, sizeof why));
    EXPECT_NE(std::string(why).find("port"), std::string::npos);
    EXPECT_TRUE(url_valid("amqp://host", why, sizeof why));
}

TEST(AmqpOptions, KnownKeys) {
    Settings s;
    parse_options(
        "user=app,password=p\\,w,connect_timeout=500,confirm_timeout=1000,"
        "tls_verify=off",
        s);
    EXPECT_EQ(s.user, "app");
    EXPECT_EQ(s.password, "p,w");
    EXPECT_EQ(s.connect_timeout_ms, 500);
    EXPECT_EQ(s.confirm_timeout_ms, 1000);
    EXPECT_FALSE(s.tls_verify);
}

TEST(AmqpOptions, ErrorsNameTheKeyNeverTheValue) {
    Settings s;
    for (const char* bad :
         {"colour=s3cret", "connect_timeout=s3cret", "tls_verify=s3cret", "tls_cert_file=s3cret"}) {
        try {
            parse_options(bad, s);
            FAIL() << bad;
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace eventbox::amqp
