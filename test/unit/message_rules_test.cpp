// Call-time validation of topics, headers and sizes (src/messages/message_rules.cpp).
#include "messages/message_rules.hpp"

#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "test_util.hpp"

namespace eventbox {
namespace {

using test::all_text;
using test::has_control_char;
using test::is_valid_utf8;

// Runs `f`, expects an eventbox::Error and returns a copy of it.
template <typename F>
Error expect_error(F f) {
    try {
        f();
    } catch (const Error& e) {
        return e;
    } catch (...) {
        ADD_FAILURE() << "threw something other than eventbox::Error";
        return Error("XX000", "wrong exception");
    }
    ADD_FAILURE() << "did not throw";
    return Error("XX000", "no exception");
}

Error topic_error(const std::string& topic) {
    return expect_error([&] { validate_topic(topic); });
}

// ---- topics -------------------------------------------------------------------------------

TEST(ValidateTopic, AcceptsEveryLegalCharacterClass) {
    EXPECT_NO_THROW(validate_topic("abcdefghijklmnopqrstuvwxyz"));
    EXPECT_NO_THROW(validate_topic("ABCDEFGHIJKLMNOPQRSTUVWXYZ"));
    EXPECT_NO_THROW(validate_topic("0123456789"));
    EXPECT_NO_THROW(validate_topic("a.b"));
    EXPECT_NO_THROW(validate_topic("a_b"));
    EXPECT_NO_THROW(validate_topic("a-b"));
    EXPECT_NO_THROW(validate_topic("orders.v1_EU-west"));
    EXPECT_NO_THROW(validate_topic("__consumer_offsets"));
}

TEST(ValidateTopic, EverySingleLegalCharacterIsATopic) {
    std::string legal = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    for (char c : legal) EXPECT_NO_THROW(validate_topic(std::string(1, c))) << c;
}

TEST(ValidateTopic, EveryOtherByteIsRefused) {
    std::string legal = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    for (int b = 0; b < 256; ++b) {
        char c = static_cast<char>(b);
        if (legal.find(c) != std::string::npos) continue;
        std::string topic = std::string("a") + c + "b";
        Error e = topic_error(topic);
        EXPECT_STREQ(e.sqlstate(), "22023") << "byte " << b;
        EXPECT_NE(std::string(e.what()).find("invalid topic name"), std::string::npos) << b;
    }
}

TEST(ValidateTopic, DotsAreLegalExceptAloneOrDoubled) {
    EXPECT_NO_THROW(validate_topic("..."));
    EXPECT_NO_THROW(validate_topic(".a"));
    EXPECT_NO_THROW(validate_topic("a."));
    EXPECT_NO_THROW(validate_topic("a..b"));
    Error one = topic_error(".");
    EXPECT_STREQ(one.sqlstate(), "22023");
    EXPECT_STREQ(one.what(), "topic name \".\" is not allowed");
    Error two = topic_error("..");
    EXPECT_STREQ(two.what(), "topic name \"..\" is not allowed");
    EXPECT_NE(two.hint().find("249"), std::string::npos);
}

TEST(ValidateTopic, EmptyIsRefused) {
    Error e = topic_error("");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "topic name must not be empty");
    EXPECT_FALSE(e.hint().empty());
}

TEST(ValidateTopic, LengthLimitIs249) {
    EXPECT_EQ(kMaxTopicLength, 249u);
    EXPECT_NO_THROW(validate_topic(std::string(248, 'a')));
    EXPECT_NO_THROW(validate_topic(std::string(249, 'a')));
    Error e = topic_error(std::string(250, 'a'));
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "topic name is too long");
    EXPECT_EQ(e.detail(), "The name is 250 bytes long.");
    EXPECT_NE(e.hint().find("1 to 249 characters"), std::string::npos);
    EXPECT_NO_THROW(validate_topic(std::string(249, '.')));  // 249 dots: legal
}

TEST(ValidateTopic, VeryLongTopicErrorIsBounded) {
    Error e = topic_error(std::string(100000, 'a'));
    EXPECT_LT(all_text(e).size(), 1000u);
}

TEST(ValidateTopic, NamesTheBadCharacter) {
    Error space = topic_error("orders created");
    EXPECT_STREQ(space.what(), "invalid topic name \"orders created\"");
    EXPECT_EQ(space.detail(), "Character \" \" is not allowed.");
    Error slash = topic_error("orders/created");
    EXPECT_EQ(slash.detail(), "Character \"/\" is not allowed.");
    Error colon = topic_error("a:b");
    EXPECT_EQ(colon.detail(), "Character \":\" is not allowed.");
}

TEST(ValidateTopic, ControlCharactersAreShownEscaped) {
    Error nl = topic_error("a\nb");
    EXPECT_STREQ(nl.what(), "invalid topic name \"a\\x0ab\"");
    EXPECT_EQ(nl.detail(), "Character \"\\x0a\" is not allowed.");
    Error nul = topic_error(std::string("a\0b", 3));
    EXPECT_EQ(nul.detail(), "Character \"\\x00\" is not allowed.");
    for (int b = 0; b < 0x20; ++b) {
        Error e = topic_error(std::string("x") + static_cast<char>(b));
        EXPECT_FALSE(has_control_char(e.what())) << b;
        EXPECT_FALSE(has_control_char(e.detail())) << b;
    }
    Error del = topic_error("x\x7f");
    EXPECT_FALSE(has_control_char(del.what()));
    EXPECT_FALSE(has_control_char(del.detail()));
}

TEST(ValidateTopic, LongInvalidTopicIsShortenedInTheMessage) {
    std::string topic = std::string(200, 'a') + " ";
    Error e = topic_error(topic);
    std::string what = e.what();
    EXPECT_NE(what.find("..."), std::string::npos);
    EXPECT_LT(what.size(), 120u);
}

// An error message must be valid UTF-8 (PostgreSQL sends it to clients as is): a non-ASCII
// character is named whole, never as its first byte.
TEST(ValidateTopic, NonAsciiCharacterIsNamedWhole) {
    Error e = topic_error("caf\xC3\xA9");  // café
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "invalid topic name \"caf\xC3\xA9\"");
    EXPECT_TRUE(is_valid_utf8(e.detail())) << e.detail();
    // Named as the character, or escaped byte by byte like control characters are.
    EXPECT_TRUE(e.detail() == "Character \"\xC3\xA9\" is not allowed." ||
                e.detail() == "Character \"\\xc3\\xa9\" is not allowed.")
        << e.detail();
    Error euro = topic_error("price\xE2\x82\xAC");
    EXPECT_TRUE(is_valid_utf8(euro.detail())) << euro.detail();
    Error emoji = topic_error("\xF0\x9F\x98\x80");
    EXPECT_TRUE(is_valid_utf8(emoji.detail())) << emoji.detail();
}

// The shortened topic in the message must not end in half a character.
TEST(ValidateTopic, ShortenedTopicIsCutOnACharacterBoundary) {
    for (std::size_t prefix = 75; prefix <= 80; ++prefix) {
        std::string topic = std::string(prefix, 'a') + "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 tail";
        Error e = topic_error(topic);
        EXPECT_TRUE(is_valid_utf8(e.what())) << "prefix " << prefix << ": " << e.what();
    }
}

// ---- headers ------------------------------------------------------------------------------

Error header_error(const std::string& name, const std::string& value) {
    return expect_error([&] { validate_header(name, value); });
}

TEST(ValidateHeader, AcceptsOrdinaryHeaders) {
    EXPECT_NO_THROW(validate_header("event_type", "OrderCreated"));
    EXPECT_NO_THROW(validate_header("ce_id", ""));  // empty value
    EXPECT_NO_THROW(validate_header("x", "tab\tinside"));
    EXPECT_NO_THROW(validate_header("caf\xC3\xA9", "\xE2\x82\xAC"));
    EXPECT_NO_THROW(validate_header("with space", "  "));
    EXPECT_NO_THROW(validate_header("Message_Id", "x"));  // header names are case-sensitive
    EXPECT_NO_THROW(validate_header("message_id2", "x"));
    EXPECT_NO_THROW(validate_header(std::string(10000, 'n'), std::string(100000, 'v')));
}

TEST(ValidateHeader, EmptyNameIsRefused) {
    Error e = header_error("", "x");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "header name must not be empty");
    EXPECT_FALSE(e.hint().empty());
}

TEST(ValidateHeader, MessageIdIsReserved) {
    EXPECT_EQ(kMessageIdHeader, "message_id");
    Error e = header_error("message_id", "0190a6d2-0000-7000-8000-000000000001");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_STREQ(e.what(), "header \"message_id\" is reserved");
    EXPECT_FALSE(e.detail().empty());
    EXPECT_NE(e.hint().find("message_id =>"), std::string::npos);
    EXPECT_NO_THROW(validate_header("x", "message_id"));
}

TEST(ValidateHeader, LineBreaksAndNulInNameAreRefused) {
    for (const std::string& name :
         {std::string("a\rb"), std::string("a\nb"), std::string("a\0b", 3), std::string("\r\n"),
          std::string("end\n")}) {
        Error e = header_error(name, "v");
        EXPECT_STREQ(e.sqlstate(), "22023");
        EXPECT_NE(std::string(e.what()).find("contains CR, LF or NUL"), std::string::npos);
        EXPECT_FALSE(has_control_char(all_text(e))) << e.what();
    }
    EXPECT_STREQ(header_error("a\rb", "v").what(),
                 "header name \"a\\x0db\" contains CR, LF or NUL");
}

TEST(ValidateHeader, LineBreaksAndNulInValueAreRefused) {
    for (const std::string& value :
         {std::string("a\rb"), std::string("a\nb"), std::string("a\0b", 3), std::string("\n"),
          std::string("x\r\n")}) {
        Error e = header_error("name", value);
        EXPECT_STREQ(e.sqlstate(), "22023");
        EXPECT_STREQ(e.what(), "value of header \"name\" contains CR, LF or NUL");
        EXPECT_FALSE(has_control_char(all_text(e)));
    }
}

TEST(ValidateHeader, ValueIsNeverShownInErrors) {
    Error e = header_error("authorization", "Bearer s3cr3t-t0ken\n");
    EXPECT_EQ(all_text(e).find("s3cr3t"), std::string::npos) << all_text(e);
}

// ---- size ---------------------------------------------------------------------------------

TEST(ValidateMessageSize, LimitIsInclusive) {
    EXPECT_NO_THROW(validate_message_size(0, 0));
    EXPECT_NO_THROW(validate_message_size(999999, 1000000));
    EXPECT_NO_THROW(validate_message_size(1000000, 1000000));
    Error e = expect_error([] { validate_message_size(1000001, 1000000); });
    EXPECT_STREQ(e.sqlstate(), "54000");
    EXPECT_STREQ(e.what(), "message is too large for Kafka");
    EXPECT_EQ(e.detail(), "The record has 1000001 bytes; eventbox.max_message_bytes is 1000000.");
    EXPECT_NE(e.hint().find("message.max.bytes"), std::string::npos);
}

TEST(ValidateMessageSize, HugeSizes) {
    Error e = expect_error([] { validate_message_size(static_cast<std::size_t>(-1), 1024); });
    EXPECT_STREQ(e.sqlstate(), "54000");
    EXPECT_NO_THROW(
        validate_message_size(static_cast<std::size_t>(-1), static_cast<std::size_t>(-1)));
}

// Kafka's record format (v2) writes lengths as zigzag varints: 0..63 take one byte, 64..8191
// two, and so on; -1 (a null value or key) one.
TEST(WireSize, VarintBytesFollowZigzagEncoding) {
    EXPECT_EQ(varint_bytes(0), 1u);
    EXPECT_EQ(varint_bytes(-1), 1u);
    EXPECT_EQ(varint_bytes(63), 1u);
    EXPECT_EQ(varint_bytes(64), 2u);
    EXPECT_EQ(varint_bytes(8191), 2u);
    EXPECT_EQ(varint_bytes(8192), 3u);
    EXPECT_EQ(varint_bytes(1000000), 3u);
    EXPECT_EQ(varint_bytes(INT64_MAX), 10u);
    EXPECT_EQ(varint_bytes(INT64_MIN), 10u);
}

// A header costs its bytes plus two length varints: 100,000 one-byte headers with empty values
// are 300,000 bytes on the wire, not 100,000 (what send() counted before).
TEST(WireSize, HeadersCountTheirFraming) {
    EXPECT_EQ(header_wire_bytes(1, 0), 3u);
    EXPECT_EQ(header_wire_bytes(10, 36), 48u);
    EXPECT_EQ(header_wire_bytes(100, 0), 103u);
    std::size_t total = 0;
    for (int i = 0; i < 100000; ++i) total += header_wire_bytes(1, 0);
    EXPECT_EQ(total, 300000u);
}

TEST(ValidateHeaderCount, AtMostTheLimit) {
    EXPECT_NO_THROW(validate_header_count(0));
    EXPECT_NO_THROW(validate_header_count(kMaxHeaders));
    Error e = expect_error([] { validate_header_count(kMaxHeaders + 1); });
    EXPECT_STREQ(e.sqlstate(), "54000");
    EXPECT_STREQ(e.what(), "too many headers");
    EXPECT_EQ(e.detail(),
              "The record has 1001 headers; at most 1000 are allowed besides message_id.");
    EXPECT_FALSE(e.hint().empty());
}

}  // namespace
}  // namespace eventbox
