// eventbox.kafka_options parsing (src/kafka/options.cpp). Values may be credentials: no error
// may ever contain one.
#include "kafka/options.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "test_util.hpp"

namespace eventbox {
namespace {

using test::all_text;

constexpr const char* kSecret = "hunter2-Sup3rS3cret";

std::vector<KafkaOption> parse(const std::string& text) {
    return parse_kafka_options(text);
}

Error parse_error(const std::string& text) {
    try {
        parse_kafka_options(text);
    } catch (const Error& e) {
        return e;
    } catch (...) {
        ADD_FAILURE() << "threw something other than eventbox::Error for: " << text;
        return Error("XX000", "wrong exception");
    }
    ADD_FAILURE() << "did not throw for: " << text;
    return Error("XX000", "no exception");
}

TEST(ParseKafkaOptions, EmptyAndBlankGiveNothing) {
    EXPECT_TRUE(parse("").empty());
    EXPECT_TRUE(parse("   ").empty());
    EXPECT_TRUE(parse("\t \t").empty());
}

TEST(ParseKafkaOptions, KeyValuePairs) {
    auto o = parse("security.protocol=SASL_SSL,sasl.mechanism=PLAIN");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0], KafkaOption("security.protocol", "SASL_SSL"));
    EXPECT_EQ(o[1], KafkaOption("sasl.mechanism", "PLAIN"));
}

TEST(ParseKafkaOptions, KeepsOrderAndDuplicates) {
    auto o = parse("a=1,b=2,a=3");
    ASSERT_EQ(o.size(), 3u);
    EXPECT_EQ(o[0], KafkaOption("a", "1"));
    EXPECT_EQ(o[1], KafkaOption("b", "2"));
    EXPECT_EQ(o[2], KafkaOption("a", "3"));
}

TEST(ParseKafkaOptions, TrimsSpacesAndTabsAroundKeysValuesAndItems) {
    auto o = parse("  a = 1 ,\tb\t=\t2\t, c=3");
    ASSERT_EQ(o.size(), 3u);
    EXPECT_EQ(o[0], KafkaOption("a", "1"));
    EXPECT_EQ(o[1], KafkaOption("b", "2"));
    EXPECT_EQ(o[2], KafkaOption("c", "3"));
}

TEST(ParseKafkaOptions, InnerSpacesOfAValueAreKept) {
    auto o = parse("sasl.jaas.config=a b  c");
    ASSERT_EQ(o.size(), 1u);
    EXPECT_EQ(o[0].second, "a b  c");
}

TEST(ParseKafkaOptions, ValueMaySplitOnFirstEqualsOnly) {
    auto o = parse("sasl.oauthbearer.config=principal=admin scope=x");
    ASSERT_EQ(o.size(), 1u);
    EXPECT_EQ(o[0].first, "sasl.oauthbearer.config");
    EXPECT_EQ(o[0].second, "principal=admin scope=x");
}

TEST(ParseKafkaOptions, EmptyValueIsAllowed) {
    auto o = parse("client.rack=");
    ASSERT_EQ(o.size(), 1u);
    EXPECT_EQ(o[0], KafkaOption("client.rack", ""));
}

TEST(ParseKafkaOptions, EscapedCommaAndBackslash) {
    auto o = parse(R"(sasl.password=a\,b,x=c\\d)");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0], KafkaOption("sasl.password", "a,b"));
    EXPECT_EQ(o[1], KafkaOption("x", R"(c\d)"));
}

TEST(ParseKafkaOptions, EscapedBackslashBeforeComma) {
    // "\\," is an escaped backslash followed by a separator.
    auto o = parse(R"(a=x\\,b=y)");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0], KafkaOption("a", R"(x\)"));
    EXPECT_EQ(o[1], KafkaOption("b", "y"));
}

TEST(ParseKafkaOptions, OtherBackslashesAreKept) {
    auto o = parse(R"(a=C:\path\to,b=end\)");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0].second, R"(C:\path\to)");
    EXPECT_EQ(o[1].second, R"(end\)");
}

TEST(ParseKafkaOptions, EmptyItemsAreSkipped) {
    auto o = parse(",a=1,,b=2,");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0], KafkaOption("a", "1"));
    EXPECT_EQ(o[1], KafkaOption("b", "2"));
    EXPECT_TRUE(parse(",,,").empty());
    EXPECT_TRUE(parse(" , \t, ").empty());
}

TEST(ParseKafkaOptions, MissingEqualsNamesThePosition) {
    Error e = parse_error("a=1,justakey,b=2");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "kafka option 2 is not of the form key=value");
    EXPECT_FALSE(e.hint().empty());
}

TEST(ParseKafkaOptions, PositionCountsEmptyItems) {
    Error e = parse_error("a=1,,novalue");
    EXPECT_STREQ(e.what(), "kafka option 3 is not of the form key=value");
}

TEST(ParseKafkaOptions, EmptyKey) {
    Error e = parse_error("a=1, =2");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "kafka option 2 has an empty key");
    EXPECT_STREQ(parse_error("=x").what(), "kafka option 1 has an empty key");
}

TEST(ParseKafkaOptions, BrokerListIsRefused) {
    for (const char* text : {"bootstrap.servers=k:9092", " bootstrap.servers = k:9092 ",
                             "acks=all,metadata.broker.list=k:9092"}) {
        Error e = parse_error(text);
        EXPECT_STREQ(e.sqlstate(), "22023") << text;
        EXPECT_NE(std::string(e.what()).find("is set by eventbox.brokers"), std::string::npos)
            << e.what();
        EXPECT_NE(e.hint().find("eventbox.brokers"), std::string::npos);
    }
    EXPECT_STREQ(parse_error("bootstrap.servers=x").what(),
                 "kafka option \"bootstrap.servers\" is set by eventbox.brokers");
}

// The secret may sit anywhere a parse error can be raised: none of them may show it.
TEST(ParseKafkaOptions, NoErrorEverContainsAValue) {
    const std::string s = kSecret;
    const std::vector<std::string> inputs = {
        "sasl.password " + s,                             // missing '='
        "sasl.username=u," + s,                           // secret as a bare item
        "sasl.username=u,sasl.password:" + s,             // wrong separator
        "=" + s,                                          // empty key
        " \t= " + s,                                      // blank key
        "bootstrap.servers=" + s,                         // refused key
        "metadata.broker.list=" + s,                      // refused key
        "sasl.password=" + s + ",bootstrap.servers=k:1",  // refused key after a secret
        "sasl.password=" + s + ",oops",                   // bad item after a secret
        "sasl.password=a\\," + s + "\\,b,oops",           // escaped commas around the secret
        "sasl.password=" + s + "\\\\,oops",               // escaped backslash before comma
        s,                                                // the whole text is the secret
        s + "\\,more",
    };
    for (const std::string& text : inputs) {
        Error e = parse_error(text);
        EXPECT_EQ(all_text(e).find(s), std::string::npos) << "input: " << text << "\n"
                                                          << "error: " << all_text(e);
        // Not even a part of it.
        EXPECT_EQ(all_text(e).find("Sup3r"), std::string::npos) << all_text(e);
    }
}

TEST(KafkaOptionsValid, AcceptsGoodAndEmpty) {
    char why[256] = "untouched";
    EXPECT_TRUE(kafka_options_valid("acks=all,linger.ms=5", why, sizeof why));
    EXPECT_TRUE(kafka_options_valid("", why, sizeof why));
    EXPECT_TRUE(kafka_options_valid(nullptr, why, sizeof why));
}

TEST(KafkaOptionsValid, ExplainsWithoutTheValue) {
    char why[256];
    std::string text = std::string("sasl.password=") + kSecret + ",garbage";
    EXPECT_FALSE(kafka_options_valid(text.c_str(), why, sizeof why));
    EXPECT_STREQ(why, "kafka option 2 is not of the form key=value");
    EXPECT_EQ(std::strstr(why, kSecret), nullptr);

    text = std::string("bootstrap.servers=") + kSecret;
    EXPECT_FALSE(kafka_options_valid(text.c_str(), why, sizeof why));
    EXPECT_EQ(std::strstr(why, kSecret), nullptr);
    EXPECT_NE(std::strstr(why, "bootstrap.servers"), nullptr);
}

TEST(KafkaOptionsValid, SmallReasonBufferIsTruncatedSafely) {
    char why[12];
    std::memset(why, '#', sizeof why);
    EXPECT_FALSE(kafka_options_valid("nokey", why, 8));
    EXPECT_LT(std::strlen(why), 8u);
    EXPECT_EQ(why[8], '#');  // nothing written past the given size
    EXPECT_FALSE(kafka_options_valid("nokey", why, 0));
    EXPECT_FALSE(kafka_options_valid("nokey", nullptr, 0));
}

}  // namespace
}  // namespace eventbox
